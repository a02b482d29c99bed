package forwarder

import (
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
)

// PartitionKey returns the partition key an outbox message was published
// with: metadata outbox.MetadataPartitionKey (set by the Subscriber whenever
// the message had a key), else outbox.PartitionKeyMetadata; "" when keyless.
func PartitionKey(msg *message.Message) string {
	if k := msg.Metadata.Get(outbox.MetadataPartitionKey); k != "" {
		return k
	}
	return msg.Metadata.Get(outbox.PartitionKeyMetadata)
}

// Outgoing returns the message as it is published to the broker: the same
// UUID, payload and metadata (including outbox.MetadataID, the stable id
// "topic/partition/seq", and the other outbox_* keys) except
// outbox.MetadataAttempt, which counts deliveries to the forwarder, not to
// the broker's consumers. The copy has no context: Reject must be called on
// the original.
func Outgoing(msg *message.Message) *message.Message {
	out := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		if k != outbox.MetadataAttempt {
			out.Metadata[k] = v
		}
	}
	return out
}
