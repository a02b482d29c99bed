package kafka

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/tombstone"
)

// UUIDHeaderKey is the record header that carries the Watermill message
// UUID, as watermill-kafka's (kafka.UUIDHeaderKey).
const UUIDHeaderKey = "_watermill_message_uuid"

// Marshaler builds the Kafka record of a message. The target sets the
// record's key (Config.Key) when it returns one, and places the record
// (Partitioner); the Marshaler sets at least Value and Headers.
type Marshaler interface {
	Marshal(topic string, msg *message.Message) (*kgo.Record, error)
}

// DefaultMarshaler writes a record exactly as watermill-kafka's
// DefaultMarshaler does, so that a watermill-kafka Subscriber (and its
// DefaultMarshaler as Unmarshaler) reads it unchanged: the UUID in header
// UUIDHeaderKey, then every metadata entry as a header, the payload as
// value. A message with metadata named UUIDHeaderKey is refused (the error
// wraps outbox.ErrInvalidArgument), as watermill-kafka refuses it.
//
// A tombstone (outbox.Tombstone) gets a null value (Value nil), which a
// compacted topic takes as the deletion of the record's key; a tombstone
// with a payload, or with a mark other than outbox.Tombstone's, is refused
// (*outboxtype.MessageError). Any other message gets a non-null value, empty
// when its payload is: only a tombstone deletes its key. (watermill-kafka
// writes a null value for a nil payload.)
type DefaultMarshaler struct{}

// Marshal implements Marshaler.
func (DefaultMarshaler) Marshal(topic string, msg *message.Message) (*kgo.Record, error) {
	if msg == nil {
		return nil, fmt.Errorf("%w: kafka.DefaultMarshaler: nil message", outbox.ErrInvalidArgument)
	}
	if value := msg.Metadata.Get(UUIDHeaderKey); value != "" {
		return nil, fmt.Errorf("%w: metadata %s is reserved by watermill for message UUID", outbox.ErrInvalidArgument, UUIDHeaderKey)
	}
	headers := make([]kgo.RecordHeader, 0, len(msg.Metadata)+1)
	headers = append(headers, kgo.RecordHeader{Key: UUIDHeaderKey, Value: []byte(msg.UUID)})
	for key, value := range msg.Metadata {
		headers = append(headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
	}
	value := msg.Payload
	if tomb, err := tombstone.Of(msg); err != nil {
		return nil, err
	} else if tomb {
		value = nil
	} else if value == nil {
		value = []byte{}
	}
	return &kgo.Record{Topic: topic, Value: value, Headers: headers}, nil
}
