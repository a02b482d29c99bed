package metrics_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/metrics"
	"github.com/millrace/watermill-outbox/retention"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// value is the value of metric name with the given labels (a subset) in
// reg: a counter's or gauge's value, a histogram's sample count; summed
// over the series that match; -1 when there is none.
func value(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	total, found := 0.0, false
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue metrics
				}
			}
			found = true
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				total += m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				total += m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	if !found {
		return -1
	}
	return total
}

func atLeast(t *testing.T, reg *prometheus.Registry, min float64, name string, labels ...string) {
	t.Helper()
	if v := value(t, reg, name, labels...); v < min {
		t.Errorf("%s%v = %v, want at least %v", name, labels, v, min)
	}
}

func eventually(t *testing.T, reg *prometheus.Registry, min float64, name string, labels ...string) {
	t.Helper()
	outboxtest.WaitFor(t, name+strings.Join(labels, ","), 30*time.Second, func() bool { return value(t, reg, name, labels...) >= min })
}

// Every metric moves when its event happens: publish, sequence, deliver
// (ack, nack, reject, timeout, and a crash counted by the next holder),
// degrade and back off, pause, dead-letter, forward (and fail a send),
// retention, and the database-derived gauges of each.
func TestEveryMetricMovesWhenItsEventHappens(t *testing.T) {
	b := outboxtest.Setup(t)
	ctx := outboxtest.Ctx(t)
	reg := prometheus.NewRegistry()
	m, err := metrics.Enable(metrics.Config{Registerer: reg, Pool: b.Pool, Schema: b.Schema, CollectInterval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Disable()
	b.Register("orders", 2)
	store, err := deadletter.NewStore(deadletter.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}

	// Publish: counters, and the pending gauges before the sequencer runs.
	b.Publish("orders",
		outboxtest.Keyed("ack-1", "a", 1, "x"), outboxtest.Keyed("nack-once", "b", 1, "x"),
		outboxtest.Keyed("reject-me", "c", 1, "x"), outboxtest.Keyed("slow-once", "d", 1, "x"),
		outboxtest.Keyed("ack-2", "e", 1, "x"))
	atLeast(t, reg, 5, "outbox_published_messages_total", "topic", "orders")
	atLeast(t, reg, 5, "outbox_published_bytes_total", "topic", "orders")
	atLeast(t, reg, 5, "outbox_pending_messages", "topic", "orders", "schema", b.Schema)
	time.Sleep(20 * time.Millisecond)
	if v := value(t, reg, "outbox_pending_oldest_age_seconds", "topic", "orders"); v <= 0 {
		t.Errorf("outbox_pending_oldest_age_seconds = %v, want > 0", v)
	}

	// Sequence.
	b.SequenceAll()
	atLeast(t, reg, 1, "outbox_sequencer_passes_total")
	atLeast(t, reg, 5, "outbox_sequencer_rows_total")
	atLeast(t, reg, 1, "outbox_sequencer_pass_duration_seconds")
	atLeast(t, reg, 1, "outbox_sequencing_delay_seconds", "topic", "orders")
	if v := value(t, reg, "outbox_pending_messages", "topic", "orders"); v > 0 {
		t.Errorf("outbox_pending_messages = %v after sequencing", v)
	}

	// Deliver: every outcome.
	var nacked, slowed atomic.Bool
	sub := b.Subscriber("g", func(c *outbox.SubscriberConfig) {
		c.RejectHandler, c.DisableSequencer, c.HandlerTimeout = store, true, 300*time.Millisecond
	})
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, reg, 1, "outbox_leases_held", "group", "g", "topic", "orders")
	atLeast(t, reg, 1, "outbox_live_members", "group", "g", "topic", "orders")
	acked := map[string]bool{}
	for len(acked) < 4 {
		select {
		case msg := <-msgs:
			switch {
			case msg.UUID == "nack-once" && nacked.CompareAndSwap(false, true):
				msg.Nack()
			case msg.UUID == "slow-once" && slowed.CompareAndSwap(false, true):
				// no answer: HandlerTimeout
			case msg.UUID == "reject-me":
				_ = outbox.Reject(msg, errors.New("poison"))
				msg.Ack()
			default:
				acked[msg.UUID] = true
				msg.Ack()
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("acked %v so far", acked)
		}
	}
	for _, outcome := range []string{"ack", "nack", "reject", "timeout"} {
		eventually(t, reg, 1, "outbox_deliveries_total", "group", "g", "topic", "orders", "outcome", outcome)
	}
	atLeast(t, reg, 1, "outbox_handler_duration_seconds", "group", "g", "topic", "orders")
	atLeast(t, reg, 1, "outbox_batch_size", "group", "g", "topic", "orders")
	eventually(t, reg, 1, "outbox_dead_letters", "group", "g", "topic", "orders", "status", "pending")
	if s := sub.Stats(); s.Acked < 4 || s.Nacked < 1 || s.Rejected != 1 || s.TimedOut < 1 || s.Batches < 1 {
		t.Errorf("Subscriber.Stats() = %+v", s)
	}
	outboxtest.WaitFor(t, "no lag for g", 30*time.Second, func() bool {
		return value(t, reg, "outbox_lag_messages", "group", "g", "topic", "orders") == 0 &&
			value(t, reg, "outbox_lag_seconds", "group", "g", "topic", "orders") == 0
	})

	// A group that fails for good: lag, degraded, backing off, holding
	// retention back; then paused.
	b.Publish("orders", outboxtest.Keyed("always-fails", "a", 2, "x"))
	b.SequenceAll()
	stuck := b.Subscriber("stuck", func(c *outbox.SubscriberConfig) {
		c.DisableSequencer = true
		c.Tuning.BackoffBase, c.Tuning.BackoffMax = 5*time.Second, 5*time.Second
	})
	stuckMsgs, err := stuck.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for msg := range stuckMsgs {
			if msg.UUID == "always-fails" {
				msg.Nack()
			} else {
				msg.Ack()
			}
		}
	}()
	eventually(t, reg, 1, "outbox_partitions_backing_off", "group", "stuck", "topic", "orders")
	eventually(t, reg, 1, "outbox_partitions_degraded", "group", "stuck", "topic", "orders")
	eventually(t, reg, 1, "outbox_lag_messages", "group", "stuck", "topic", "orders")
	if v := value(t, reg, "outbox_lag_seconds", "group", "stuck", "topic", "orders"); v <= 0 {
		t.Errorf("outbox_lag_seconds of a stuck group = %v, want > 0", v)
	}
	a, err := admin.New(admin.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pause(ctx, admin.Scope{Group: "stuck", Topic: "orders"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, reg, 2, "outbox_partitions_paused", "group", "stuck", "topic", "orders")

	// Retention: what g consumed is deleted up to the lowest cursor, and
	// the stuck group is named as the one holding the rest.
	vac, err := retention.NewVacuum(retention.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vac.VacuumOnce(ctx); err != nil {
		t.Fatal(err)
	}
	atLeast(t, reg, 1, "outbox_retention_deleted_rows_total", "topic", "orders")
	atLeast(t, reg, 1, "outbox_retention_held_messages", "topic", "orders", "group", "stuck")

	// A crash: a delivery counted on the cursor row that never ended is
	// counted as a failed attempt, and as outcome "crash", by the next
	// holder.
	b.Register("crashes", 1)
	first := b.Subscriber("c", func(c *outbox.SubscriberConfig) { c.DisableSequencer = true })
	if _, err := first.Subscribe(ctx, "crashes"); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "cursors of c", 30*time.Second, func() bool {
		return b.Int("SELECT count(*) FROM "+b.Schema+".cursors WHERE group_name = 'c'") == 1
	})
	_ = first.Close()
	b.Publish("crashes", message.NewMessage("crashed", []byte("x")))
	b.SequenceAll()
	// As a process that died while delivering the message alone leaves
	// it: counted and in flight, alone in its process (the evidence a
	// crash is charged on; migrations/0009_crash_evidence.sql).
	b.Exec("UPDATE " + b.Schema + ".cursors SET deliveries = attempts + 1, inflight_from = seq + 1, inflight_to = seq + 1, inflight_solo = true, lease_owner = NULL WHERE group_name = 'c'")
	second := b.Subscriber("c", func(c *outbox.SubscriberConfig) { c.DisableSequencer = true })
	crashMsgs, err := second.Subscribe(ctx, "crashes")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-crashMsgs:
		msg.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("the crashed message was not delivered again")
	}
	atLeast(t, reg, 1, "outbox_deliveries_total", "group", "c", "topic", "crashes", "outcome", "crash")
	if second.Stats().Crashed < 1 {
		t.Errorf("Stats().Crashed = %d", second.Stats().Crashed)
	}

	// Forwarder: a failed send, then records and bytes.
	var calls atomic.Int32
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Schema: b.Schema, Pool: b.Pool, ConsumerGroup: "fwd", Tuning: outboxtest.FastTuning(), Advanced: outboxtest.FastAdvanced(), DisableSequencer: true, CloseTimeout: time.Second},
		Topics:     []string{"orders"},
		Target: forwarder.TargetFunc(func(_ context.Context, _ string, batch []*message.Message) (int, error) {
			if calls.Add(1) == 1 {
				return 0, errors.New("broker down")
			}
			return len(batch), nil
		}),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	eventually(t, reg, 1, "outbox_forwarder_records_total", "topic", "orders")
	atLeast(t, reg, 1, "outbox_forwarder_bytes_total", "topic", "orders")
	atLeast(t, reg, 2, "outbox_forwarder_send_duration_seconds", "topic", "orders")
	atLeast(t, reg, 1, "outbox_forwarder_errors_total", "topic", "orders", "kind", "broker")
	_ = fwd.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	atLeast(t, reg, 1, "outbox_collector_up", "schema", b.Schema)

	// Disabled: events no longer count.
	m.Disable()
	if value(t, reg, "outbox_published_messages_total") != -1 {
		t.Error("metrics still registered after Disable")
	}
}

// Enable twice on one registry is refused with a typed error.
func TestEnableTwiceIsAConfigError(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.Enable(metrics.Config{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Disable()
	if _, err := metrics.Enable(metrics.Config{Registerer: reg}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("second Enable: %v, want ErrInvalidConfig", err)
	}
	if _, err := metrics.Enable(metrics.Config{}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("no Registerer: %v", err)
	}
}

// A collection that fails (here: a schema that was never migrated) is
// counted, marks the collector down, and serves the last figures.
func TestCollectorFailureIsCountedAndMarkedDown(t *testing.T) {
	b := outboxtest.Setup(t)
	c, err := metrics.NewCollector(metrics.CollectorConfig{Pool: b.Pool, Schema: "never_migrated", CollectInterval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	atLeast(t, reg, 1, "outbox_collector_errors_total", "schema", "never_migrated")
	if v := value(t, reg, "outbox_collector_up", "schema", "never_migrated"); v != 0 {
		t.Fatalf("outbox_collector_up = %v for a failing collection", v)
	}
	atLeast(t, reg, 0, "outbox_collector_duration_seconds", "schema", "never_migrated")
	if _, err := metrics.NewCollector(metrics.CollectorConfig{}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("no pool: %v", err)
	}
}

// histogramSum is the sum of the samples of histogram name for topic.
func histogramSum(t *testing.T, reg *prometheus.Registry, name, topic string) (sum float64, count uint64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "topic" && l.GetValue() == topic {
					sum += m.GetHistogram().GetSampleSum()
					count += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return sum, count
}

// A delayed message's sequencing delay counts from its delivery time, not
// from its publish: a message published an hour ago for delivery now was
// not late by an hour (which the dashboard's p99 would show as the top
// bucket for as long as delays are used).
func TestSequencingDelayOfADelayedMessageCountsFromItsDueTime(t *testing.T) {
	b := outboxtest.Setup(t)
	reg := prometheus.NewRegistry()
	m, err := metrics.Enable(metrics.Config{Registerer: reg, Pool: b.Pool, Schema: b.Schema, CollectInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Disable()
	b.Register("reminders", 1)
	msg := outboxtest.Keyed("remind", "customer-1", 0, "x")
	if err := outbox.DeliverAfter(msg, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	b.Publish("reminders", msg)
	// As if published an hour ago for delivery now: its INSERT an hour
	// back, its delivery time a moment ago.
	b.Exec("UPDATE " + b.Schema + ".pending SET created_at = now() - interval '1 hour', deliver_at = now() - interval '1 second'")
	if n := b.SequenceAll(); n != 1 {
		t.Fatalf("sequenced %d, want the due message", n)
	}
	sum, count := histogramSum(t, reg, "outbox_sequencing_delay_seconds", "reminders")
	if count != 1 || sum < 1 || sum > 600 {
		t.Fatalf("outbox_sequencing_delay_seconds{topic=reminders}: %d samples summing %.1fs; want one of about a second (since it was due), not an hour (since its publish)", count, sum)
	}
}
