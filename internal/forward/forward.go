// Package forward is the Forwarder's batch handler (package forwarder):
// what happens to one batch of one outbox partition on its way to a
// target. It is a package of its own so that the deterministic simulator
// (internal/sim) drives the same handler the product runs, without a
// database.
package forward

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/origin"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// errPartialConfirm: a target confirmed part of a batch without an error.
var errPartialConfirm = errors.New("forwarder: target confirmed part of the batch without an error")

// Config is one handler's: where its batches come from and go.
type Config struct {
	// Source, Schema and Group name the outbox side (the origin the
	// targets read: see internal/origin); Source may be empty.
	Source, Schema, Group string
	// Topic is the outbox topic, Partitions its partition count (0:
	// unknown), TargetTopic where it goes.
	Topic, TargetTopic string
	Partitions         int
	// Send sends a batch, with the origin made of Source, Schema, Group
	// and Partitions: the target's send (TargetSend) with its errors
	// marked BrokerWide, or the middleware chain around it (whose errors
	// are each message's own).
	Send Send
	// Counts are the Forwarder's running totals (nil: none kept).
	Counts *Counts
	Logger watermill.LoggerAdapter
}

// Counts are a Forwarder's running totals (forwarder.Stats).
type Counts struct {
	Batches, Messages, Failures, Rejected atomic.Int64
	LastError                             atomic.Pointer[string]
}

// Handler returns the batch handler (an outbox.BatchHandler) of cfg.
func Handler(cfg Config) func(ctx context.Context, batch []*message.Message) (int, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	logger = logger.With(watermill.LogFields{"topic": cfg.Topic, "target_topic": cfg.TargetTopic})
	from := origin.Origin{Source: cfg.Source, Schema: cfg.Schema, Group: cfg.Group, Partitions: cfg.Partitions}
	counts := cfg.Counts
	if counts == nil {
		counts = &Counts{}
	}
	if observe.Enabled() {
		observe.Current().Forwarding(cfg.Source, cfg.TargetTopic) // its error series exist at 0 before the first send
	}
	return func(ctx context.Context, batch []*message.Message) (int, error) {
		if err := CheckBatch(batch); err != nil {
			return 0, err
		}
		// One send ends with the batch: at the Subscriber's
		// HandlerTimeout, which its messages' context carries, so that it
		// ends before the partition's lease can.
		if len(batch) > 0 {
			if deadline, ok := batch[0].Context().Deadline(); ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, deadline)
				defer cancel()
			}
		}
		// The source is the forwarder's to say: a value the message
		// brought along (it was forwarded into this outbox from another)
		// would make the targets take it for another source's.
		for _, m := range batch {
			if cfg.Source != "" {
				m.Metadata.Set(outbox.MetadataSource, cfg.Source)
			} else {
				delete(m.Metadata, outbox.MetadataSource)
			}
		}
		span := observe.StartForward(ctx, cfg.Topic, cfg.TargetTopic, batch)
		start := time.Now()
		done, err := cfg.Send(ctx, from, cfg.TargetTopic, batch)
		done = max(0, min(done, len(batch)))
		if done < len(batch) && err == nil {
			err = BrokerWide(fmt.Errorf("%w: %d of %d messages", errPartialConfirm, done, len(batch)))
		}
		span.EndWith(err, attribute.Int("messaging.outbox.confirmed", done))
		if observe.Enabled() {
			observe.Current().Forwarded(cfg.Source, cfg.TargetTopic, done, MessageBytes(batch[:done]), time.Since(start), ErrorKind(ctx, err))
		}
		counts.Messages.Add(int64(done))
		if done == len(batch) {
			counts.Batches.Add(1)
			return done, nil
		}
		counts.Failures.Add(1)
		msg := err.Error()
		counts.LastError.Store(&msg)
		if errors.Is(err, outbox.ErrPoison) {
			counts.Rejected.Add(1)
			return done, err // the target logged it
		}
		logger.Info("Send failed, the rest of the batch is retried", watermill.LogFields{
			"partition": batch[0].Metadata.Get(outbox.MetadataPartition),
			"from_seq":  batch[done].Metadata.Get(outbox.MetadataSeq),
			"confirmed": done,
			"batch":     len(batch),
			"err":       err.Error(),
		})
		return done, err
	}
}

// Target is what a Forwarder sends through (forwarder.Target).
type Target interface {
	Send(ctx context.Context, topic string, batch []*message.Message) (done int, err error)
}

// Send sends a batch of an outbox partition to topic; from says where the
// batch comes from (the Forwarder's part of its origin.Origin).
type Send func(ctx context.Context, from origin.Origin, topic string, batch []*message.Message) (int, error)

// Explicit returns the send of a target that takes the batch's origin as
// an argument (the exactly-once Kafka target, which names and fences its
// writers by it), when target is one: package forwarder/kafka sets it as
// it initialises. Other targets need no origin.
var Explicit func(target any) (Send, bool)

// Direct is target's send: Explicit's when it has one, else its Send (the
// origin is the batch's own metadata then).
func Direct(target Target) Send {
	if Explicit != nil {
		if send, ok := Explicit(target); ok {
			return send
		}
	}
	return func(ctx context.Context, _ origin.Origin, topic string, batch []*message.Message) (int, error) {
		return target.Send(ctx, topic, batch)
	}
}

// TargetSend is Config.Send for target without middleware: Direct(target),
// its errors marked BrokerWide.
func TargetSend(target Target) Send {
	send := Direct(target)
	return func(ctx context.Context, from origin.Origin, topic string, batch []*message.Message) (int, error) {
		done, err := send(ctx, from, topic, batch)
		return done, BrokerWide(err)
	}
}

// CheckBatch refuses a batch holding a nil message, before anything is
// sent.
func CheckBatch(batch []*message.Message) error {
	for i, m := range batch {
		if m == nil {
			return &outboxtype.MessageError{UUID: "(nil)", Reason: fmt.Sprintf("message %d (0-based) of the batch of %d is nil; nothing was sent", i, len(batch))}
		}
	}
	return nil
}

// BrokerWide marks a failed send as the broker's, not the message's
// (outbox.NotKeySpecific): with key isolation the partition then blocks
// and backs off instead of holding keys back, since every key would fail
// alike. A message the broker refused for good (outbox.ErrPoison) is the
// message's own.
func BrokerWide(err error) error {
	if err == nil || errors.Is(err, outbox.ErrPoison) || errors.Is(err, outbox.ErrNotKeySpecific) {
		return err
	}
	return outbox.NotKeySpecific(err)
}

// MessageBytes is the size of msgs as a broker sees it: payloads and
// metadata keys and values.
func MessageBytes(msgs []*message.Message) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Payload)
		for k, v := range m.Metadata {
			n += len(k) + len(v)
		}
	}
	return n
}

// ErrorKind classifies a failed send for the metrics: "" (none), "poison"
// (the broker refused a message for good: rejected), "timeout" (the
// Subscriber's HandlerTimeout), "partial" (the broker confirmed only part
// of the batch without saying why) or "broker" (any other error of the
// target).
func ErrorKind(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, outbox.ErrPoison):
		return "poison"
	case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		return "timeout"
	case errors.Is(err, errPartialConfirm):
		return "partial"
	}
	return "broker"
}
