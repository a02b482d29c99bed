package deadletter

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// PoisonPublisher returns a message.Publisher for Watermill's PoisonQueue
// middleware, which publishes a message its handler failed on:
//
//	poison, err := middleware.PoisonQueue(store.PoisonPublisher(), "dead_letters")
//	router.AddMiddleware(poison)
//
// The poison topic name is not used: entries go to the store.
//
// A message delivered by an outbox Subscriber (outbox.IsDelivered) is
// rejected with outbox.RejectTo(msg, reason, store), with the reason the
// middleware recorded (middleware.ReasonForPoisonedKey): the Subscriber
// then writes the entry into this store, with the metadata the middleware
// set, in the transaction that moves the cursor past the message, and moves
// on at once (no backoff). Wiring the store here is enough: the Subscriber
// needs no RejectHandler for it (give it one as well, with MaxAttempts, to
// also take out messages that crash or hang their consumer).
//
// Any other message (e.g. from another broker's subscriber) is written
// directly, in a transaction of its own, as an External entry: its group is
// the handler name the middleware recorded, its topic the subscribed
// topic. If that write fails, Publish fails, and the middleware passes the
// handler's error on, so the message is nacked and retried.
func (s *Store) PoisonPublisher() message.Publisher { return poisonPublisher{s} }

type poisonPublisher struct{ s *Store }

// Publish dead-letters msgs; see Store.PoisonPublisher.
func (p poisonPublisher) Publish(topic string, msgs ...*message.Message) error {
	var errs []error
	for i, msg := range msgs {
		if msg == nil {
			errs = append(errs, &outboxtype.MessageError{UUID: "(nil)", Reason: fmt.Sprintf("message %d (0-based) of the %d given to Publish is nil", i, len(msgs))})
			continue
		}
		reason := msg.Metadata.Get(middleware.ReasonForPoisonedKey)
		if reason == "" {
			reason = "poisoned"
		}
		if outbox.IsDelivered(msg) {
			_ = outbox.RejectTo(msg, errors.New(reason), p.s)
			continue
		}
		sourceTopic := msg.Metadata.Get(middleware.PoisonedTopicKey)
		if sourceTopic == "" {
			sourceTopic = topic
		}
		now := time.Now()
		md := make(map[string]string, len(msg.Metadata))
		for k, v := range msg.Metadata {
			md[k] = v
		}
		_, err := p.s.Add(msg.Context(), outboxtype.RejectedMessage{
			Group:        msg.Metadata.Get(middleware.PoisonedHandlerKey),
			Topic:        sourceTopic,
			UUID:         msg.UUID,
			PartitionKey: msg.Metadata.Get(outbox.PublishPartitionKeyMetadata),
			Metadata:     md,
			Payload:      msg.Payload,
			Reason:       errors.New(reason),
			Attempts:     1,
			FirstFailure: now,
			LastFailure:  now,
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("deadletter: message %s: %w", msg.UUID, err))
		}
	}
	return errors.Join(errs...)
}

// Close does nothing: the store needs no closing.
func (poisonPublisher) Close() error { return nil }
