package pipeline_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/pipeline"
)

// backends counts the client connections to pool's database, the one
// asking left out.
func backends(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(outboxtest.Ctx(t), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A quiet source holds two connections (its LISTEN connection and one in
// its pool), whatever its pool opened for a burst; a message published
// after the quiet spell is forwarded at once, woken by notifications (the
// safety-net polls are an hour away), and the pool opens what it needs
// again.
func TestFleetQuietSourceHoldsTwoConnectionsAndWakesOnNotify(t *testing.T) {
	const schema = "shop_outbox"
	trimLogs := watermill.NewCaptureLogger()
	eu := outboxtest.Shard(t, schema)
	eu.Register("orders", 4)
	br := newBroker()
	f, err := pipeline.NewFleet(pipeline.FleetConfig{
		Sources: []pipeline.Source{{Name: "eu", Pool: eu.Pool, Schema: schema}},
		Pipeline: pipeline.Config{
			Forward: forwarder.Config{Topics: []string{"orders"}, Target: br, Subscriber: outbox.SubscriberConfig{
				Tuning: adaptive.Default(), Advanced: outbox.Advanced{PollInterval: time.Hour}}},
			Sequencer:        outbox.SequencerConfig{PollInterval: time.Hour},
			DisableRetention: true,
		},
		CheckInterval: 20 * time.Millisecond,
		TrimIdleAfter: 200 * time.Millisecond,
	}, trimLogs)
	if err != nil {
		t.Fatal(err)
	}
	startFleet(t, f)
	// A burst: four partitions at once, and the publishers, open several
	// connections of the pool.
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		eu.Publish("orders", outboxtest.Keyed("burst-"+k, k, 1, "eu"))
	}
	outboxtest.WaitFor(t, "the burst forwarded", 30*time.Second, func() bool { return br.count("orders") == 8 })
	if n := eu.Pool.Stat().TotalConns(); n < 2 {
		t.Fatalf("the burst left %d connections in the pool: nothing to trim, the test proves nothing", n)
	}
	outboxtest.WaitFor(t, "the quiet source down to its LISTEN connection and one in the pool", 30*time.Second, func() bool {
		// backends' own query takes a pool connection: the one kept.
		return backends(t, eu.Pool) <= 1 && eu.Pool.Stat().TotalConns() == 1
	})
	if !trimmed(trimLogs) { // what TestFleetTrimIdleOff looks for
		t.Fatal("the pool came down to one connection without the fleet's trim saying so")
	}

	eu.Publish("orders", outboxtest.Keyed("after", "a", 2, "eu"))
	outboxtest.WaitFor(t, "the message after the quiet spell, woken by notifications", 30*time.Second, func() bool { return br.count("orders") == 9 })
	outboxtest.WaitFor(t, "the source running after the trim", 30*time.Second, func() bool {
		return f.Status()[0].State == pipeline.SourceRunning
	})
}

// TrimIdleAfter must not be refused, and a negative one turns the trim off:
// the fleet closes none of the pool's connections. (That the pool still
// holds all it opened is no proof: on a loaded machine a statement whose
// context ends takes its connection with it.)
func TestFleetTrimIdleOff(t *testing.T) {
	const schema = "shop_outbox"
	logs := watermill.NewCaptureLogger()
	eu := outboxtest.Shard(t, schema)
	eu.Register("orders", 1)
	br := newBroker()
	f, err := pipeline.NewFleet(pipeline.FleetConfig{
		Sources:       []pipeline.Source{{Name: "eu", Pool: eu.Pool, Schema: schema}},
		Pipeline:      pipeline.Config{Forward: forwarder.Config{Topics: []string{"orders"}, Target: br}, DisableRetention: true},
		CheckInterval: 10 * time.Millisecond,
		TrimIdleAfter: -1,
	}, logs)
	if err != nil {
		t.Fatal(err)
	}
	// Three idle connections opened before the fleet runs.
	ctx := context.Background()
	var conns []*pgxpool.Conn
	for range 3 {
		c, err := eu.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	startFleet(t, f)
	eu.Publish("orders", outboxtest.Keyed("one", "a", 1, "eu"))
	outboxtest.WaitFor(t, "the message forwarded", 30*time.Second, func() bool { return br.count("orders") == 1 })
	checks := f.Status()[0].LastCheck
	outboxtest.WaitFor(t, "fifty more checks", 30*time.Second, func() bool { return f.Status()[0].LastCheck.Sub(checks) >= 50*10*time.Millisecond })
	if trimmed(logs) {
		t.Fatal("with TrimIdleAfter negative the fleet trimmed the pool")
	}
}

// trimmed reports whether the fleet logged a trim of a pool.
func trimmed(logs *watermill.CaptureLoggerAdapter) bool {
	for _, entries := range logs.Captured() {
		for _, l := range entries {
			if strings.Contains(l.Msg, "Closed the idle connections") {
				return true
			}
		}
	}
	return false
}
