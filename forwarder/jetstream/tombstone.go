package jetstream

import (
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/tombstone"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Tombstones (outbox.Tombstone) and per-key subjects (Config.KeySubjects).
//
// JetStream's equivalent of a compacted Kafka topic is a stream that keeps
// the last message of each subject (MaxMsgsPerSubject 1, or a KV bucket),
// with the key in the subject. A tombstone then purges its key's subject:
// it is published with header Nats-Rollup "sub", which makes the server
// remove every earlier message of the subject when it stores this one, and
// with KV-Operation "PURGE", which makes it a KV bucket's purge (the key
// reads as deleted, its history is gone). The rollup is a publish like any
// other: in order with the messages before and after it, and dropped as a
// copy by its Nats-Msg-Id when it is sent again. A purge through the
// stream API (Stream.Purge with a subject filter) would be neither: it
// would need the messages published before it acknowledged first, and a
// copy sent again after a later message of the key would purge that one.
//
// Without per-key subjects every key shares the subject, and a rollup or a
// purge would remove the other keys' messages too: a tombstone is then
// published as a message with an empty body and header outbox_tombstone
// (a deletion consumers see), and removes nothing.

// Headers of a tombstone on a per-key subject.
const (
	kvOperationHeader = "KV-Operation"
	kvPurge           = "PURGE"
)

// shape makes nm, the NATS message the Marshaler built of msg for subject,
// what the target publishes: on the key's subject (KeySubjects), a
// tombstone purging it, a CloudEvent (CloudEvents). A message it cannot
// make is refused with a *outboxtype.MessageError (rejected by the target).
func (t *Target) shape(nm *nats.Msg, subject string, msg *message.Message) error {
	tomb, err := tombstone.Of(msg)
	if err != nil {
		return err
	}
	key := forwarder.PartitionKey(msg)
	if tomb {
		if err := tombstone.CheckKey(msg, key); err != nil {
			return err
		}
		nm.Data = nil
	}
	if nm.Header == nil {
		nm.Header = nats.Header{}
	}
	if t.cfg.KeySubjects {
		if err := checkSubjectKey(msg, key); err != nil {
			return err
		}
		nm.Subject = subject + "." + key
		if tomb {
			nm.Header.Set(natsjs.MsgRollup, natsjs.MsgRollupSubject)
			nm.Header.Set(kvOperationHeader, kvPurge)
		}
	}
	if t.cfg.CloudEvents.Mode != forwarder.CloudEventsOff {
		return cloudEvent(t.cfg.CloudEvents, nm, msg, key, tomb)
	}
	return nil
}

// checkSubjectKey refuses a key that cannot end a subject: none, or one
// with spaces, control characters, wildcards or an empty token.
func checkSubjectKey(msg *message.Message, key string) error {
	if key == "" {
		return &outboxtype.MessageError{UUID: msg.UUID, Reason: "no partition key: with KeySubjects, the subject is the key's"}
	}
	for _, r := range key {
		if r <= ' ' || r == 0x7f || r == '*' || r == '>' {
			return &outboxtype.MessageError{UUID: msg.UUID, Reason: fmt.Sprintf("partition key %q cannot end a NATS subject (KeySubjects): no spaces, control characters, '*' or '>'", key)}
		}
	}
	if strings.HasPrefix(key, ".") || strings.HasSuffix(key, ".") || strings.Contains(key, "..") {
		return &outboxtype.MessageError{UUID: msg.UUID, Reason: fmt.Sprintf("partition key %q cannot end a NATS subject (KeySubjects): it has an empty token", key)}
	}
	return nil
}
