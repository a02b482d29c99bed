// Package syncrun carries, from package outbox to package outboxtest, what
// a synchronous runner needs to drive a consumer group's delivery in the
// caller's goroutine with the Subscriber's own machinery: the workers'
// shared config, the lease manager and the sequencer. Package outbox fills
// Open when it is initialized; nothing else sets it.
package syncrun

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/lease"
)

// Subscription is a Subscriber prepared for one topic, not started.
type Subscription struct {
	// Workers is the config a consumer.Worker of this subscription takes.
	Workers *consumer.Config
	// Manager leases the topic's partitions for the group (Step / Stop).
	Manager *lease.Manager
	// Topic and Incarnation name what is delivered.
	Topic, Incarnation string
	// Sequence numbers every committed pending message (nil: the
	// Subscriber runs no sequencer, DisableSequencer).
	Sequence func(ctx context.Context) (int, error)
	// TickState reads why the runner holds no lease: how many of the
	// topic's partitions are paused, and how many are leased by another
	// member.
	TickState func(ctx context.Context) (paused, leasedByOthers int, err error)
	// Close closes the Subscriber.
	Close func() error
}

// Open prepares a Subscriber of cfg (an outbox.SubscriberConfig) for topic.
var Open func(ctx context.Context, cfg any, topic string, logger watermill.LoggerAdapter) (*Subscription, error)
