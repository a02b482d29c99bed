// Package tombstone holds the mark of a tombstone (outbox.Tombstone) and
// its check, shared by the Publisher, which refuses a bad tombstone before
// it is written, and the forwarder's targets, which refuse one that
// reaches them another way (a Target's Send called directly).
package tombstone

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Metadata is the metadata key of the mark (outbox.MetadataTombstone), and
// Marked its only value.
const (
	Metadata = "outbox_tombstone"
	Marked   = "true"
)

// Of reports whether msg is marked as a tombstone. A mark with another
// value, or a tombstone with a payload, is a *outboxtype.MessageError
// (ErrInvalidMessage). A nil msg is no tombstone.
func Of(msg *message.Message) (bool, error) {
	if msg == nil {
		return false, nil
	}
	switch v, ok := msg.Metadata[Metadata]; {
	case !ok || v == "":
		return false, nil
	case v != Marked:
		return false, &outboxtype.MessageError{UUID: msg.UUID, Reason: fmt.Sprintf("metadata %s is %q: the only value is %q, set by outbox.Tombstone", Metadata, v, Marked)}
	case len(msg.Payload) > 0:
		return true, &outboxtype.MessageError{UUID: msg.UUID, Reason: fmt.Sprintf("a tombstone carries no payload, this one has %d bytes: a tombstone deletes its key, it does not set a value", len(msg.Payload))}
	}
	return true, nil
}

// CheckKey refuses a tombstone without a key: compaction deletes by key, so
// a keyless tombstone deletes nothing (and a compacted Kafka topic refuses
// a keyless record).
func CheckKey(msg *message.Message, key string) error {
	if key == "" {
		return &outboxtype.MessageError{UUID: msg.UUID, Reason: "a tombstone needs a partition key: compaction deletes the records of its key, and a keyless tombstone has none"}
	}
	return nil
}
