package kafka

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
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
	return &kgo.Record{Topic: topic, Value: msg.Payload, Headers: headers}, nil
}
