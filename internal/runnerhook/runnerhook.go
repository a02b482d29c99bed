// Package runnerhook lets package outboxtest drive a Subscriber's delivery
// one turn at a time (its Runner) without package outbox exporting the
// internal type of that delivery. Package outbox sets Subscription when it
// is initialised; outboxtest imports outbox, so it is set before use.
package runnerhook

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/consumer"
)

// Subscription returns sub's (an *outbox.Subscriber's) delivery of topic,
// to be driven one turn at a time by its caller instead of by goroutines
// of its own. Its messages go to out (one at a time), or to batch when it
// is not nil.
var Subscription func(sub any, ctx context.Context, topic string, out chan<- *message.Message, batch consumer.BatchHandler) (*consumer.Subscription, error)
