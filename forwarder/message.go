package forwarder

import (
	"reflect"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
)

// PartitionKey returns the partition key an outbox message was published
// with: metadata outbox.MetadataPartitionKey (set by the Subscriber whenever
// the message had a key), else outbox.PublishPartitionKeyMetadata; "" when
// keyless.
func PartitionKey(msg *message.Message) string {
	if msg == nil {
		return ""
	}
	if k := msg.Metadata.Get(outbox.MetadataPartitionKey); k != "" {
		return k
	}
	return msg.Metadata.Get(outbox.PublishPartitionKeyMetadata)
}

// Outgoing returns the message as it is published to the broker: the same
// UUID, payload and metadata (including outbox.MetadataID, the stable id
// "topic/partition/seq", and the other outbox_* keys) except
// outbox.MetadataAttempt, which counts deliveries to the forwarder, not to
// the broker's consumers. The copy has no context: Reject must be called on
// the original.
func Outgoing(msg *message.Message) *message.Message {
	if msg == nil {
		return nil
	}
	out := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		if k != outbox.MetadataAttempt {
			out.Metadata[k] = v
		}
	}
	return out
}

// isNil reports a nil interface value, or one that holds a nil pointer,
// function, map, slice or channel (a TargetFunc(nil), a nil *kafka.Target).
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Slice, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
