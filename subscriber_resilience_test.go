package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// victimPool is a pool whose connections can be told apart on the server.
func victimPool(t *testing.T, name string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestSubscriberSurvivesKilledConnections(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("rough", 4)
	uuids := publishKeyed(t, e, "rough", 16, 60)
	pool := victimPool(t, "victim")
	sub := newSub(t, env{e.WithPool(pool)}, "g", nil)
	h := &handled{}
	wg := consume(context.Background(), t, sub, "rough", "victim", h, 2*time.Millisecond)

	// Kill every connection of the subscriber (workers, lease manager,
	// listener, embedded sequencer) again and again while it works.
	kills := 0
	for h.distinct() < len(uuids) && kills < 40 {
		time.Sleep(50 * time.Millisecond)
		var n int
		if err := e.Pool.QueryRow(outboxtest.Ctx(t), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = 'victim' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		kills += n
	}
	if kills == 0 {
		t.Fatal("no connection was killed: the test did not test anything")
	}
	outboxtest.WaitFor(t, "every message despite the killed connections", 2*time.Minute, func() bool { return h.distinct() == len(uuids) })
	dups := h.checkOrder(t, uuids)
	t.Logf("%d connections killed; %d deliveries, %d duplicates (identified by id)", kills, len(h.calls), dups)
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func TestSubscriberConfigValidation(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	badTuning := adaptive.Default()
	badTuning.LeaseTTL = 50 * time.Millisecond
	cases := map[string]outbox.SubscriberConfig{
		"no pool":                         {ConsumerGroup: "g"},
		"no group":                        {Pool: pool},
		"unknown strategy":                {Pool: pool, ConsumerGroup: "g", Strategy: 7},
		"max attempts below RetryForever": {Pool: pool, ConsumerGroup: "g", MaxAttempts: -2},
		"lease TTL below 100ms":           {Pool: pool, ConsumerGroup: "g", Tuning: badTuning},
		"handler timeout past lease":      {Pool: pool, ConsumerGroup: "g", Tuning: adaptive.Default(), HandlerTimeout: time.Hour},
		"negative handler timeout":        {Pool: pool, ConsumerGroup: "g", HandlerTimeout: -time.Second},
		"negative poll interval":          {Pool: pool, ConsumerGroup: "g", Advanced: outbox.Advanced{PollInterval: -time.Second}},
		"negative bulkhead":               {Pool: pool, ConsumerGroup: "g", Advanced: outbox.Advanced{MaxConcurrentPartitions: -1}},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := outbox.NewSubscriber(cfg, nil)
			if !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
	if _, err := outbox.NewSubscriber(outbox.SubscriberConfig{Pool: pool, ConsumerGroup: "g", Schema: "Bad-Schema"}, nil); !errors.Is(err, outbox.ErrInvalidName) {
		t.Fatalf("bad schema: %v", err)
	}
	// A group name a terminal would act on (or that PostgreSQL cannot
	// store) is refused before anything starts.
	for _, group := range []string{"a\x00b", "a\x1b]0;t\a", "billing\r\nfake", "\u202Egnillib", strings.Repeat("g", 201), "\xff"} {
		if _, err := outbox.NewSubscriber(outbox.SubscriberConfig{Pool: pool, ConsumerGroup: group}, nil); !errors.Is(err, outbox.ErrInvalidName) {
			t.Errorf("group %q: %v, want ErrInvalidName", group, err)
		}
	}
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Pool: pool, ConsumerGroup: "g"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Subscribe(context.Background(), "bad topic"); !errors.Is(err, outbox.ErrInvalidName) {
		t.Fatalf("bad topic: %v", err)
	}
	_ = sub.Close()
	if _, err := sub.Subscribe(context.Background(), "t"); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("subscribe after close: %v", err)
	}
}

// Closing the Subscriber leaves a handler holding a message CloseTimeout to
// answer: the message's context does not end with Close (a handler's own
// database call on it still runs), and an Ack within that time moves the
// cursor, so the next start does not deliver the message again.
func TestCloseLeavesTheHandlerCloseTimeoutToAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("closing", 1)
	publishKeyed(t, e, "closing", 1, 1)
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, ConsumerGroup: "g", CloseTimeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The notification listener ends as soon as Close begins (the
	// subscription waits for the handler's answer).
	begun := make(chan struct{}, 1)
	outbox.SetExitHook(sub, func(what string) {
		if what == "listener" {
			begun <- struct{}{}
		}
	})
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "closing")
	if err != nil {
		t.Fatal(err)
	}
	m := <-msgs
	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	<-begun // Close has begun and waits for the answer
	if err := m.Context().Err(); err != nil {
		t.Fatalf("the message's context ended when Close began: %v", err)
	}
	var one int
	if err := e.Pool.QueryRow(m.Context(), "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("a handler's database call on the message's context: %v", err)
	}
	m.Ack()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return after the Ack")
	}
	if seq := e.Int("SELECT seq FROM " + e.Schema + ".cursors WHERE group_name = 'g' AND topic = 'closing'"); seq != 1 {
		t.Fatalf("cursor at %d after an Ack within CloseTimeout, want 1", seq)
	}
}
