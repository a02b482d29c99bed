package outbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// A Transactional Subscriber refuses a pool too small for the partitions
// it may work on at once plus its leases and sequencer (pgxpool's default
// on a 2-core machine: 4), with the number it needs; one that fits, a
// smaller bulkhead, and the Leased strategy are accepted.
func TestTransactionalSubscriberRefusesAPoolThatWouldStarveItsLeases(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 16)
	e.Register("small", 2)
	cfg := e.Pool.Config().Copy()
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(outboxtest.Ctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	subscribe := func(strategy outbox.Strategy, maxConcurrent int, topic string) error {
		sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Pool: pool, Schema: e.Schema, ConsumerGroup: "billing",
			Strategy: strategy, Tuning: adaptive.Default(), Advanced: outbox.Advanced{MaxConcurrentPartitions: maxConcurrent}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		_, err = sub.Subscribe(outboxtest.Ctx(t), topic)
		return err
	}
	err = subscribe(outbox.Transactional, 0, "orders")
	var ce *outboxtype.ConfigError
	if !errors.Is(err, outbox.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != "Pool" ||
		!strings.Contains(err.Error(), "MaxConns is 4") || !strings.Contains(err.Error(), "pool_max_conns=18") {
		t.Fatalf("Transactional on 16 partitions with a pool of 4: %v; want a *ConfigError on Pool asking for 18", err)
	}
	if err := subscribe(outbox.Transactional, 2, "orders"); err != nil {
		t.Errorf("Transactional with MaxConcurrentPartitions 2 (needs 4): %v", err)
	}
	if err := subscribe(outbox.Transactional, 0, "small"); err != nil {
		t.Errorf("Transactional on a 2-partition topic (needs 4): %v", err)
	}
	if err := subscribe(outbox.Leased, 0, "orders"); err != nil {
		t.Errorf("Leased with a pool of 4: %v", err)
	}
}
