package kafka

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/internal/tombstone"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Tombstones (outbox.Tombstone) into Kafka.
//
// A tombstone is a record with its key and a null value: on a compacted
// topic (cleanup.policy=compact), the log cleaner removes every earlier
// record of the key, and the tombstone itself after the topic's
// delete.retention.ms. So the record of a tombstone must have a key, and
// its value must be null, not empty: Kafka keeps a record with an empty
// value as the key's latest value.

// tombstoneRecord makes r, the record the Marshaler built of msg, a
// tombstone when msg is one: it reports whether it is, and refuses
// (*outboxtype.MessageError, rejected by the target) a tombstone with a payload,
// a bad mark, no record key (Config.Key gave none), or a value the
// Marshaler gave it.
func tombstoneRecord(msg *message.Message, r *kgo.Record) (bool, error) {
	is, err := tombstone.Of(msg)
	if err != nil || !is {
		return false, err
	}
	if err := tombstone.CheckKey(msg, string(r.Key)); err != nil {
		return true, err
	}
	if len(r.Value) > 0 {
		return true, &outboxtype.MessageError{UUID: msg.UUID, Reason: "the Marshaler gave the tombstone a value: a tombstone's record has a null value, or compaction keeps it as the key's value"}
	}
	r.Value = nil // null, not empty
	return true, nil
}
