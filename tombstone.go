package outbox

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/tombstone"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// MetadataTombstone ("outbox_tombstone") marks a message as a tombstone:
// its value is "true", set by Tombstone. The mark travels with the message
// as any metadata does (a header on Kafka and NATS), so consumers see it.
const MetadataTombstone = tombstone.Metadata

// Tombstone marks msg, a message with an empty payload, as a tombstone: a
// message that deletes its partition key. The forwarder's Kafka target
// sends it as a record with the key and a null value, which a compacted
// topic (cleanup.policy=compact) takes as the deletion of the key; the
// JetStream target with per-key subjects (jetstream.Config.KeySubjects)
// sends it as a rollup that purges the key's subject (docs/forwarder.md,
// "Tombstones"). Subscribers of the outbox deliver it as a message with an
// empty payload and metadata MetadataTombstone.
//
// A tombstone needs a partition key: the Publisher refuses one without a
// key, or with a payload, as a *outboxtype.MessageError (ErrInvalidMessage), and
// writes nothing of the Publish call. Tombstone itself refuses a nil msg
// (ErrInvalidArgument) and a msg with a payload (*outboxtype.MessageError), and then
// leaves msg unchanged.
func Tombstone(msg *message.Message) error {
	if msg == nil {
		return errs.NilArgument("outbox.Tombstone: msg", "pass the message to mark, with an empty payload and a partition key")
	}
	if len(msg.Payload) > 0 {
		return &outboxtype.MessageError{UUID: msg.UUID, Reason: fmt.Sprintf("a tombstone carries no payload, this one has %d bytes: a tombstone deletes its key, it does not set a value", len(msg.Payload))}
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	msg.Metadata.Set(MetadataTombstone, tombstone.Marked)
	return nil
}

// IsTombstone reports whether msg is marked as a tombstone (see Tombstone).
// A nil msg is not.
func IsTombstone(msg *message.Message) bool {
	return msg != nil && msg.Metadata.Get(MetadataTombstone) == tombstone.Marked
}

// checkTombstone refuses, before anything is written, a message marked as a
// tombstone that carries a payload or has no partition key, and a mark
// other than Tombstone's.
func checkTombstone(m *message.Message, key string) error {
	is, err := tombstone.Of(m)
	if err != nil || !is {
		return err
	}
	return tombstone.CheckKey(m, key)
}
