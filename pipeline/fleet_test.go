package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/metrics"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/pipeline"
)

// startFleet runs f until the test ends, and fails the test if Run fails.
func startFleet(t *testing.T, f *pipeline.Fleet) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f.Run(context.Background()) }()
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// fromSources counts what br got for topic by source, and fails the test
// when a message's payload names another source than its metadata.
func fromSources(t *testing.T, br *broker, topic string) map[string]int {
	t.Helper()
	br.mu.Lock()
	defer br.mu.Unlock()
	out := map[string]int{}
	last := map[string]int{}
	for _, m := range br.got[topic] {
		src := m.Metadata.Get(outbox.MetadataSource)
		if want := string(m.Payload); want != src {
			t.Fatalf("message %s (id %s) published in %s arrived as from %q", m.UUID, m.Metadata.Get(outbox.MetadataID), want, src)
		}
		key := src + "/" + m.Metadata.Get(outbox.PublishPartitionKeyMetadata)
		n, _ := strconv.Atoi(m.Metadata.Get("n"))
		if n <= last[key] {
			t.Fatalf("%s: message %d after %d", key, n, last[key])
		}
		last[key] = n
		out[src]++
	}
	return out
}

// publishTo publishes n messages of one key to shard, numbered from 1, with
// the shard's name as payload.
func publishTo(b *outboxtest.Bundle, name string, from, n int) {
	for i := from; i < from+n; i++ {
		b.Publish("orders", outboxtest.Keyed(fmt.Sprintf("%s-%d", name, i), "k", i, name))
	}
}

// Three databases with the same schema, topic, partitions and consumer
// group, so their messages have the same stable ids: the Fleet forwards
// each source's messages in order, each with its own source; a source
// added at run time starts at once, one removed stops.
func TestFleetForwardsEverySourceUnderItsOwnName(t *testing.T) {
	const schema = "shop_outbox"
	shards := map[string]*outboxtest.Bundle{}
	for _, name := range []string{"eu", "us", "apac"} {
		shards[name] = outboxtest.Shard(t, schema)
		shards[name].Register("orders", 2)
	}
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before, pgxAsyncClose) })
	br := newBroker()
	f, err := pipeline.NewFleet(pipeline.FleetConfig{
		Sources: []pipeline.Source{
			{Name: "eu", Pool: shards["eu"].Pool, Schema: schema},
			{Name: "us", Pool: shards["us"].Pool, Schema: schema},
		},
		Pipeline:      pipeline.Config{Forward: forwarder.Config{Topics: []string{"orders"}, Target: br}},
		CheckInterval: 100 * time.Millisecond,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	startFleet(t, f)
	for name, b := range shards {
		publishTo(b, name, 1, 10)
	}
	outboxtest.WaitFor(t, "eu's and us's messages", 30*time.Second, func() bool {
		got := fromSources(t, br, "orders")
		return got["eu"] == 10 && got["us"] == 10
	})
	if got := fromSources(t, br, "orders"); got["apac"] != 0 {
		t.Fatalf("apac forwarded before it was added: %v", got)
	}

	if err := f.Add(pipeline.Source{Name: "apac", Pool: shards["apac"].Pool, Schema: schema}); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "apac's messages once added", 30*time.Second, func() bool { return fromSources(t, br, "orders")["apac"] == 10 })
	outboxtest.WaitFor(t, "every source running", 10*time.Second, func() bool {
		st := f.Status()
		return len(st) == 3 && st[0].Name == "apac" && st[0].State == pipeline.SourceRunning &&
			st[1].State == pipeline.SourceRunning && st[2].State == pipeline.SourceRunning && st[2].Stats.Forwarder.Messages == 10
	})

	if err := f.Remove("us"); err != nil {
		t.Fatal(err)
	}
	publishTo(shards["us"], "us", 11, 5)
	publishTo(shards["eu"], "eu", 11, 5)
	outboxtest.WaitFor(t, "eu's later messages", 30*time.Second, func() bool { return fromSources(t, br, "orders")["eu"] == 15 })
	time.Sleep(300 * time.Millisecond) // what us would have sent by now
	if got := fromSources(t, br, "orders"); got["us"] != 10 {
		t.Fatalf("us forwarded %d after it was removed, want 10", got["us"])
	}
	if st := f.Status(); len(st) != 2 {
		t.Fatalf("Status after Remove: %+v", st)
	}
}

// A source whose database cannot be reached is shown so, in Status and in
// outbox_source_up, while the other sources go on.
func TestFleetKeepsForwardingWhenOneSourceIsDown(t *testing.T) {
	const schema = "shop_outbox"
	eu := outboxtest.Shard(t, schema)
	eu.Register("orders", 2)
	// A database nobody listens for: every connection is refused.
	down, err := pgxpool.New(context.Background(), "postgres://outbox@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(down.Close)
	reg := prometheus.NewRegistry()
	m, err := metrics.Enable(metrics.Config{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Disable)

	br := newBroker()
	f, err := pipeline.NewFleet(pipeline.FleetConfig{
		Sources:        []pipeline.Source{{Name: "eu", Pool: eu.Pool, Schema: schema}, {Name: "us", Pool: down, Schema: schema}},
		Pipeline:       pipeline.Config{Forward: forwarder.Config{Topics: []string{"orders"}, Target: br}},
		CheckInterval:  100 * time.Millisecond,
		RestartBackoff: 200 * time.Millisecond,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	startFleet(t, f)
	publishTo(eu, "eu", 1, 10)
	outboxtest.WaitFor(t, "eu's messages while us is down", 30*time.Second, func() bool { return fromSources(t, br, "orders")["eu"] == 10 })
	outboxtest.WaitFor(t, "us shown as not running, with its error", 10*time.Second, func() bool {
		st := f.Status()
		us := st[1]
		return us.Name == "us" && us.State != pipeline.SourceRunning && us.State != pipeline.SourceStarting && us.LastError != "" && st[0].State == pipeline.SourceRunning
	})
	outboxtest.WaitFor(t, "outbox_source_up 1 for eu, 0 for us", 10*time.Second, func() bool {
		return sampleSum(t, reg, "outbox_source_up", "eu") == 1 && sampleSum(t, reg, "outbox_source_up", "us") == 0 &&
			series(t, reg, "outbox_source_up") == 2
	})
	if v := sampleSum(t, reg, "outbox_forwarder_records_total", "eu"); v != 10 {
		t.Fatalf("outbox_forwarder_records_total{source=eu} = %v, want 10", v)
	}
}

// series counts the series of name in reg.
func series(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// sampleSum sums the samples (counters, gauges) of name{source=source} in
// reg.
func sampleSum(t *testing.T, reg *prometheus.Registry, name, source string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source" && l.GetValue() == source {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}

// What a Fleet refuses, typed: and nothing of it runs.
func TestFleetRefusesBadSources(t *testing.T) {
	b := outboxtest.Setup(t)
	fwd := forwarder.Config{Topics: []string{"orders"}, Target: newBroker()}
	for name, cfg := range map[string]pipeline.FleetConfig{
		"a source without a name":  {Sources: []pipeline.Source{{Pool: b.Pool}}, Pipeline: pipeline.Config{Forward: fwd}},
		"a name with a slash":      {Sources: []pipeline.Source{{Name: "eu/1", Pool: b.Pool}}, Pipeline: pipeline.Config{Forward: fwd}},
		"a name twice":             {Sources: []pipeline.Source{{Name: "eu", Pool: b.Pool}, {Name: "eu", Pool: b.Pool}}, Pipeline: pipeline.Config{Forward: fwd}},
		"a source without a pool":  {Sources: []pipeline.Source{{Name: "eu"}}, Pipeline: pipeline.Config{Forward: fwd}},
		"a pool for every source":  {Pipeline: pipeline.Config{Pool: b.Pool, Forward: fwd}},
		"a source for every one":   {Pipeline: pipeline.Config{Source: "eu", Forward: fwd}},
		"a bad template":           {Pipeline: pipeline.Config{Forward: forwarder.Config{Topics: []string{"orders"}}}},
		"a negative CheckInterval": {CheckInterval: -1, Pipeline: pipeline.Config{Forward: fwd}},
		"one outbox under two names": {Sources: []pipeline.Source{{Name: "eu", Pool: b.Pool, Schema: b.Schema}, {Name: "eu-again", Pool: b.Pool, Schema: b.Schema}},
			Pipeline: pipeline.Config{Forward: fwd}},
	} {
		_, err := pipeline.NewFleet(cfg, nil)
		var ce *outboxtype.ConfigError
		if !errors.As(err, &ce) && !errors.Is(err, outbox.ErrInvalidName) {
			t.Errorf("%s: %v, want a ConfigError or NameError", name, err)
		}
	}
	f, err := pipeline.NewFleet(pipeline.FleetConfig{Pipeline: pipeline.Config{Forward: fwd}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Add(pipeline.Source{Name: "eu", Pool: b.Pool, Schema: b.Schema}); err != nil {
		t.Fatal(err)
	}
	var ce *outboxtype.ConfigError
	if err := f.Add(pipeline.Source{Name: "eu", Pool: b.Pool}); !errors.As(err, &ce) {
		t.Errorf("Add of a name it has: %v", err)
	}
	if err := f.Add(pipeline.Source{Name: "eu-again", Pool: b.Pool, Schema: b.Schema}); !errors.As(err, &ce) || !strings.Contains(err.Error(), "same outbox") {
		t.Errorf("Add of the outbox of eu under another name: %v", err)
	}
	if err := f.Remove("nope"); !errors.As(err, &ce) {
		t.Errorf("Remove of an unknown name: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Add(pipeline.Source{Name: "us", Pool: b.Pool}); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("Add after Close: %v", err)
	}
	var zero *pipeline.Fleet
	if err := zero.Run(context.Background()); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("Run of a nil Fleet: %v", err)
	}
}

// A source removed right after it was added, again and again while its
// database is being published to, leaves no lease behind: its partitions
// are free for the next pipeline at once, not after the lease TTL. Before,
// a lease acquired as the pipeline stopped (the statement ran, its answer
// was cancelled) or whose row was locked at release stayed taken.
func TestFleetRemoveRightAfterAddLeavesNoLease(t *testing.T) {
	const schema = "shop_outbox"
	eu := outboxtest.Shard(t, schema)
	eu.Register("orders", 4)
	f, err := pipeline.NewFleet(pipeline.FleetConfig{
		Pipeline: pipeline.Config{Forward: forwarder.Config{Topics: []string{"orders"}, Target: newBroker()}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	startFleet(t, f)
	ctx, stop := context.WithCancel(context.Background())
	published := make(chan struct{})
	go func() {
		defer close(published)
		pub := eu.Publisher(nil)
		for i := 0; ctx.Err() == nil; i++ {
			_ = pub.Publish("orders", outboxtest.Keyed(fmt.Sprintf("m-%d", i), fmt.Sprintf("k%d", i%7), i, "eu"))
		}
	}()
	defer func() { stop(); <-published }()
	for i := range 40 {
		if err := f.Add(pipeline.Source{Name: "eu", Pool: eu.Pool, Schema: schema}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i) * time.Millisecond)
		if err := f.Remove("eu"); err != nil {
			t.Fatal(err)
		}
		if n := eu.Int("SELECT count(*) FROM " + schema + ".cursors WHERE lease_owner IS NOT NULL AND lease_expires_at > now()"); n > 0 {
			t.Fatalf("round %d: %d leases held after Remove returned", i, n)
		}
	}
}

// Once Run has returned (its context ended), every source shows stopped
// and Add says the Fleet stopped rather than adding a source nothing runs.
func TestFleetAfterRunReturned(t *testing.T) {
	eu := outboxtest.Shard(t, "shop_outbox")
	eu.Register("orders", 2)
	f, err := pipeline.NewFleet(pipeline.FleetConfig{
		Sources:  []pipeline.Source{{Name: "eu", Pool: eu.Pool, Schema: "shop_outbox"}},
		Pipeline: pipeline.Config{Forward: forwarder.Config{Topics: []string{"orders"}, Target: newBroker()}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	outboxtest.WaitFor(t, "eu running", 10*time.Second, func() bool { return f.Status()[0].State == pipeline.SourceRunning })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st := f.Status(); st[0].State != pipeline.SourceStopped {
		t.Fatalf("Status after Run returned: %+v, want stopped", st)
	}
	if err := f.Add(pipeline.Source{Name: "us", Pool: eu.Pool}); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Add after Run returned: %v, want ErrClosed", err)
	}
}
