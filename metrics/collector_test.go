package metrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/metrics"
)

// With no sequencer running, committed messages pile up unsequenced: the
// group's lag counts them, and its age is the oldest one's, in the metrics
// as in admin.Status. Before, both read 0 for a group that had everything
// sequenced done.
func TestLagCountsCommittedMessagesNotYetSequenced(t *testing.T) {
	b := outboxtest.Setup(t)
	ctx := outboxtest.Ctx(t)
	b.Register("orders", 2)
	reg := prometheus.NewRegistry()
	m, err := metrics.Enable(metrics.Config{Registerer: reg, Pool: b.Pool, Schema: b.Schema, CollectInterval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Disable()

	// A group that has done everything sequenced so far, and no sequencer.
	b.PublishN("orders", 4, "early")
	b.SequenceAll()
	b.Exec("INSERT INTO " + b.Schema + ".cursors (group_name, topic, partition, seq) SELECT 'g', topic, partition, last_seq FROM " +
		b.Schema + ".partitions WHERE topic = 'orders'")
	if v := value(t, reg, "outbox_lag_messages", "group", "g", "topic", "orders"); v != 0 {
		t.Fatalf("outbox_lag_messages before anything is left = %v, want 0", v)
	}

	b.PublishN("orders", 7, "late")
	b.Exec("UPDATE " + b.Schema + ".pending SET created_at = now() - interval '25 minutes'")
	if v := value(t, reg, "outbox_pending_messages", "topic", "orders"); v != 7 {
		t.Fatalf("outbox_pending_messages = %v, want 7", v)
	}
	if v := value(t, reg, "outbox_lag_messages", "group", "g", "topic", "orders"); v != 7 {
		t.Errorf("outbox_lag_messages with 7 messages committed and not sequenced = %v, want 7", v)
	}
	if v := value(t, reg, "outbox_lag_seconds", "group", "g", "topic", "orders"); v < 25*60 || v > 30*60 {
		t.Errorf("outbox_lag_seconds with the oldest unsequenced message 25 minutes old = %v", v)
	}

	rep, err := mustAdmin(t, b).Status(ctx, admin.Filter{Topic: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Topics) != 1 || len(rep.Topics[0].Groups) != 1 {
		t.Fatalf("status: %+v", rep.Topics)
	}
	if g := rep.Topics[0].Groups[0]; g.Lag != 7 || g.MaxLagSeconds < 25*60 || g.MaxLagSeconds > 30*60 {
		t.Errorf("admin.Status of g: lag %d, max lag %.0f s; want 7 and about 1500 s", g.Lag, g.MaxLagSeconds)
	}

	// Sequenced: the lag is behind the cursors now, the same count.
	b.SequenceAll()
	if v := value(t, reg, "outbox_lag_messages", "group", "g", "topic", "orders"); v != 7 {
		t.Errorf("outbox_lag_messages once sequenced = %v, want 7", v)
	}
}

// The pending gauges of a topic with nothing pending read 0 (before, the
// series disappeared once the sequencer had caught up, and a topic never
// published to had none).
func TestPendingGaugesReadZeroWhenNothingWaits(t *testing.T) {
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	b.Register("idle", 1)
	reg := prometheus.NewRegistry()
	m, err := metrics.Enable(metrics.Config{Registerer: reg, Pool: b.Pool, Schema: b.Schema, CollectInterval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Disable()
	b.PublishN("orders", 3, "m")
	if v := value(t, reg, "outbox_pending_messages", "topic", "orders"); v != 3 {
		t.Fatalf("outbox_pending_messages = %v, want 3", v)
	}
	b.SequenceAll()
	for _, topic := range []string{"orders", "idle"} {
		for _, name := range []string{"outbox_pending_messages", "outbox_pending_oldest_age_seconds"} {
			if v := value(t, reg, name, "topic", topic, "schema", b.Schema); v != 0 {
				t.Errorf("%s{topic=%q} with nothing pending = %v, want 0 (-1: absent)", name, topic, v)
			}
		}
	}
}

// outbox_forwarder_errors_total exists at 0 for every kind from the
// forwarder's start, before any send, so that an alert on its increase
// sees the first error.
func TestForwarderErrorSeriesExistAtZeroFromTheStart(t *testing.T) {
	b := outboxtest.Setup(t)
	ctx := outboxtest.Ctx(t)
	b.Register("orders", 1)
	reg := prometheus.NewRegistry()
	m, err := metrics.Enable(metrics.Config{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Disable()
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber:  outbox.SubscriberConfig{Schema: b.Schema, Pool: b.Pool, ConsumerGroup: "fwd", Tuning: outboxtest.FastTuning(), Advanced: outboxtest.FastAdvanced(), CloseTimeout: time.Second},
		Topics:      []string{"orders"},
		TargetTopic: func(topic string) string { return "broker." + topic },
		Target: forwarder.TargetFunc(func(context.Context, string, []*message.Message) (int, error) {
			t.Error("a send with nothing published")
			return 0, nil
		}),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	defer func() {
		_ = fwd.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	outboxtest.WaitFor(t, "the forwarder's error series", 30*time.Second, func() bool {
		return value(t, reg, "outbox_forwarder_errors_total", "topic", "broker.orders") != -1
	})
	for _, kind := range []string{"poison", "timeout", "partial", "broker"} {
		if v := value(t, reg, "outbox_forwarder_errors_total", "topic", "broker.orders", "kind", kind); v != 0 {
			t.Errorf("outbox_forwarder_errors_total{kind=%q} before any send = %v, want 0", kind, v)
		}
	}
	if v := value(t, reg, "outbox_forwarder_records_total", "topic", "broker.orders"); v != 0 {
		t.Errorf("outbox_forwarder_records_total before any send = %v, want 0", v)
	}
}

func mustAdmin(t *testing.T, b *outboxtest.Bundle) *admin.Admin {
	t.Helper()
	a, err := admin.New(admin.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// outbox_live_members counts the members heard from within their own
// lease TTL, as their heartbeats recorded it (it used a MemberTimeout of
// 30 s, whatever the members' TTL).
func TestLiveMembersAreThoseWithinTheirOwnTTL(t *testing.T) {
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	reg := prometheus.NewRegistry()
	m, err := metrics.Enable(metrics.Config{Registerer: reg, Pool: b.Pool, Schema: b.Schema, CollectInterval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Disable()
	b.Exec("INSERT INTO " + b.Schema + ".cursors (group_name, topic, partition) VALUES ('g', 'orders', 0)")
	b.Exec("INSERT INTO " + b.Schema + `.members (group_name, topic, member_id, heartbeat_at, ttl) VALUES
		('g', 'orders', 'expired', now() - interval '2 seconds', interval '1 second'),
		('g', 'orders', 'patient', now() - interval '40 seconds', interval '60 seconds'),
		('g', 'orders', 'fresh', now(), interval '1 second')`)
	if v := value(t, reg, "outbox_live_members", "group", "g", "topic", "orders"); v != 2 {
		t.Fatalf("outbox_live_members = %v, want 2 (patient and fresh)", v)
	}
}

// Two databases with the same schema on one registry: each collector's
// gauges carry its source (without it, registering the second fails as a
// duplicate of the first).
func TestCollectorsOfSeveralSourcesShareARegistry(t *testing.T) {
	const schema = "shop_outbox"
	eu, us := outboxtest.Shard(t, schema), outboxtest.Shard(t, schema)
	eu.Register("orders", 2)
	us.Register("orders", 2)
	eu.PublishN("orders", 3, "eu")
	us.PublishN("orders", 5, "us")
	reg := prometheus.NewRegistry()
	for name, b := range map[string]*outboxtest.Bundle{"eu": eu, "us": us} {
		c, err := metrics.NewCollector(metrics.CollectorConfig{Pool: b.Pool, Schema: schema, Source: name})
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Register(c); err != nil {
			t.Fatalf("register the collector of %s: %v", name, err)
		}
	}
	if v := value(t, reg, "outbox_pending_messages", "source", "eu", "topic", "orders"); v != 3 {
		t.Errorf("eu's pending = %v, want 3", v)
	}
	if v := value(t, reg, "outbox_pending_messages", "source", "us", "topic", "orders"); v != 5 {
		t.Errorf("us's pending = %v, want 5", v)
	}
	if _, err := metrics.NewCollector(metrics.CollectorConfig{Pool: eu.Pool, Source: "eu/1"}); !errors.Is(err, outbox.ErrInvalidName) {
		t.Errorf("a source name with a slash: %v, want ErrInvalidName", err)
	}
}
