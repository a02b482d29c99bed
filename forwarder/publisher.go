package forwarder

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/forward"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// PublisherTarget forwards to any Watermill message.Publisher: one Publish
// call per batch, with the messages as Outgoing returns them. A Publisher
// cannot say which of the messages of a failed call arrived, so a failure
// counts for the whole batch (all of it is sent again: duplicates with the
// stable id in metadata outbox_id); the Subscriber then shrinks the batch.
// When a message alone in its batch fails with an error Permanent accepts,
// it is taken out of the stream with outbox.Reject.
//
// Per-key order needs a Publisher that publishes the messages of a call in
// order and stops at the first failure (watermill-kafka's, watermill-nats's
// and watermill-sql's do).
type PublisherTarget struct {
	// Publisher is the Watermill publisher. Required.
	Publisher message.Publisher
	// Permanent says whether a Publish error means the message can never be
	// published (default: never).
	Permanent func(err error) bool
}

// NewPublisherTarget returns a PublisherTarget for pub.
func NewPublisherTarget(pub message.Publisher, permanent func(error) bool) *PublisherTarget {
	return &PublisherTarget{Publisher: pub, Permanent: permanent}
}

// Send implements Target.
func (t *PublisherTarget) Send(ctx context.Context, topic string, batch []*message.Message) (int, error) {
	if isNil(t.Publisher) {
		return 0, &outboxtype.ConfigError{Field: "PublisherTarget.Publisher", Reason: "required: the Watermill publisher to forward to"}
	}
	if err := forward.CheckBatch(batch); err != nil {
		return 0, err
	}
	out := make([]*message.Message, len(batch))
	for i, m := range batch {
		out[i] = Outgoing(m)
		out[i].SetContext(ctx)
	}
	err := t.Publisher.Publish(topic, out...)
	if err == nil {
		return len(batch), nil
	}
	if len(batch) == 1 && t.Permanent != nil && t.Permanent(err) {
		return 0, outbox.Reject(batch[0], err)
	}
	return 0, fmt.Errorf("forwarder: publish: %w", err)
}
