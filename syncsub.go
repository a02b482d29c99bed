package outbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/syncrun"
)

// Package outboxtest drives a Subscriber's delivery synchronously with the
// Subscriber's own workers, leases and sequencer, which stay unexported
// here; this hands them over (internal/syncrun).
func init() { syncrun.Open = openSync }

func openSync(ctx context.Context, cfg any, topic string, logger watermill.LoggerAdapter) (*syncrun.Subscription, error) {
	c, ok := cfg.(SubscriberConfig)
	if !ok {
		return nil, &errs.ConfigError{Field: "cfg", Reason: fmt.Sprintf("want an outbox.SubscriberConfig, got %T", cfg)}
	}
	s, err := NewSubscriber(c, logger)
	if err != nil {
		return nil, err
	}
	if err := s.SubscribeInitialize(topic); err != nil {
		_ = s.Close()
		return nil, err
	}
	manager, incarnation, err := s.prepare(ctx, topic)
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	sub := &syncrun.Subscription{
		Workers:     s.workers,
		Manager:     manager,
		Topic:       topic,
		Incarnation: incarnation,
		Close:       s.Close,
		TickState: func(ctx context.Context) (paused, others int, err error) {
			var p, o int32
			err = s.cfg.Pool.QueryRow(ctx, dbsql.For(s.cfg.Schema).CursorsTickState, s.cfg.ConsumerGroup, topic, manager.MemberID()).Scan(&p, &o)
			return int(p), int(o), err
		},
	}
	if s.sequencer != nil {
		sub.Sequence = s.sequencer.SequenceAll
	}
	return sub, nil
}
