package main

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/pipeline"
)

// The sources phase (not run unless named): one pipeline.Fleet over
// several databases into one Kafka topic, exactly once.
//
//   - For each count of -sources-counts (1,2,3): that many databases, each
//     with the topic in -partitions partitions; -messages messages in all,
//     an equal share published into each database in transactions of
//     -sources-per-tx by -publishers goroutines split among them, the
//     fleet running from the start. End-to-end msg/s (first BEGIN to the
//     last record at the broker), CPU per message of this process and of
//     PostgreSQL, and the client connections of the sources' databases.
//   - -sources-idle databases (50) with one fleet over them: CPU per second
//     and connections with nothing published, then with a trickle of
//     -sources-trickle msg/s into each database.
//
// Every database is on the bench's one PostgreSQL server: on this machine
// the sources share its two cores, as they would not in production, where
// each is a primary of its own. What is measured is the relay's cost per
// source and per message.

// sourcesRun is one throughput run of the sources phase.
type sourcesRun struct {
	// Load is "same total" (the messages and publishers of the phase
	// split among the sources, as fast as they go) or "same per source"
	// (each source offered OfferedPerSource msg/s).
	Load             string  `json:"load"`
	OfferedPerSource float64 `json:"offered_msg_per_s_per_source,omitempty"`
	Sources          int     `json:"sources"`
	Messages         int     `json:"messages"`
	PerTx            int     `json:"per_tx"`
	Publishers       int     `json:"publishers"`
	Seconds          float64 `json:"seconds"`
	Rate             float64 `json:"msg_per_s"`
	Complete         bool    `json:"complete"`
	// CPU per message, µs, of this process (publishers, relay, broker)
	// and of the PostgreSQL server.
	ProcessMicrosPerMessage  float64 `json:"process_cpu_us_per_msg"`
	PostgresMicrosPerMessage float64 `json:"postgres_cpu_us_per_msg"`
	// Connections are the client connections to the sources' databases
	// at the end (relay and publishers).
	Connections int `json:"connections"`
	// MessagesPerSend is the mean batch of the forwarders (messages per
	// Kafka transaction), RowsPerPass the mean sequencer pass: what the
	// per-message CPU is amortized over.
	MessagesPerSend float64 `json:"messages_per_send"`
	RowsPerPass     float64 `json:"rows_per_pass"`
}

// Loads of the sources phase's throughput runs.
const (
	loadTotal     = "same total"
	loadPerSource = "same per source"
)

// sourcesIdle is the many-sources run of the sources phase.
type sourcesIdle struct {
	Sources int     `json:"sources"`
	Seconds float64 `json:"seconds"`
	// Idle: CPU ms per second and the relay's connections with nothing
	// published.
	IdleProcessMillisPerSecond  float64 `json:"idle_process_cpu_ms_per_s"`
	IdlePostgresMillisPerSecond float64 `json:"idle_postgres_cpu_ms_per_s"`
	IdleConnections             int     `json:"idle_connections"`
	// Trickle: the same with TricklePerSource msg/s published into each.
	TricklePerSource               float64     `json:"trickle_msg_per_s_per_source"`
	TrickleProcessMillisPerSecond  float64     `json:"trickle_process_cpu_ms_per_s"`
	TricklePostgresMillisPerSecond float64     `json:"trickle_postgres_cpu_ms_per_s"`
	TrickleDelivered               int64       `json:"trickle_delivered"`
	TricklePublished               int64       `json:"trickle_published"`
	Statements                     []statement `json:"top_statements,omitempty"`
	// Settle is how long the fleet ran before the idle window (s; 0 in
	// results from before it was set: 5 s).
	Settle float64 `json:"settle_s,omitempty"`
	// Breakdown takes the idle window apart (nil in results from before
	// it was measured).
	Breakdown *idleBreakdown `json:"idle_breakdown,omitempty"`
}

// sourcesResult is the sources phase.
type sourcesResult struct {
	Runs []*sourcesRun `json:"runs"`
	Idle *sourcesIdle  `json:"idle,omitempty"`
}

// fleetDBs is a set of source databases on the bench server and a fleet
// over them.
type fleetDBs struct {
	names  []string
	relay  []*pgxpool.Pool // the fleet's pools
	pubs   []*pgxpool.Pool // the publishers' pools
	pub    *outbox.Publisher
	fleet  *pipeline.Fleet
	target *kafka.Target
	done   chan error
}

// databaseURL is b.dbURL on database name.
func (b *bench) databaseURL(name string) (string, error) {
	u, err := url.Parse(b.dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return b.dbURL + " dbname=" + name, nil
	}
	u.Path = "/" + name
	return u.String(), nil
}

// createSources creates n databases named prefix_i, each migrated with
// outboxTopic in partitions partitions, a pool of relayConns for the fleet
// and one of pubConns for the publishers on each (pubConns 0: none).
func (b *bench) createSources(ctx context.Context, prefix string, n, partitions, relayConns, pubConns int) (*fleetDBs, error) {
	f := &fleetDBs{}
	var err error
	if f.pub, err = outbox.NewPublisher(outbox.PublisherConfig{DisableNotify: !b.cfg.outboxNotify}, nil); err != nil {
		return nil, err
	}
	for i := range n {
		name := fmt.Sprintf("%s_%d", prefix, i)
		if _, err := b.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return f, err
		}
		f.names = append(f.names, name)
		dsn, err := b.databaseURL(name)
		if err != nil {
			return f, err
		}
		open := func(conns int) (*pgxpool.Pool, error) {
			pc, err := pgxpool.ParseConfig(dsn)
			if err != nil {
				return nil, err
			}
			pc.MaxConns = int32(conns)
			return pgxpool.NewWithConfig(ctx, pc)
		}
		relay, err := open(relayConns)
		if err != nil {
			return f, err
		}
		f.relay = append(f.relay, relay)
		if err := outbox.Migrate(ctx, relay, outbox.DefaultSchema); err != nil {
			return f, err
		}
		var topicOpts []outbox.TopicOption
		if b.cfg.forwardOnly {
			topicOpts = append(topicOpts, outbox.ForwardOnly())
		}
		if err := outbox.RegisterTopic(ctx, relay, outbox.DefaultSchema, outboxTopic, partitions, topicOpts...); err != nil {
			return f, err
		}
		if pubConns > 0 {
			pub, err := open(pubConns)
			if err != nil {
				return f, err
			}
			f.pubs = append(f.pubs, pub)
		}
	}
	return f, nil
}

// startFleet runs a fleet over f's databases into kafkaTopic on brokers.
func (f *fleetDBs) startFleet(brokers []string, kafkaTopic string) error {
	var err error
	if f.target, err = kafka.NewTarget(kafka.Config{Brokers: brokers}, nil); err != nil {
		return err
	}
	fc := pipeline.FleetConfig{Pipeline: pipeline.Config{Forward: forwarder.Config{
		Subscriber:  outbox.SubscriberConfig{Tuning: adaptive.Default(), CloseTimeout: 5 * time.Second},
		Topics:      []string{outboxTopic},
		Target:      f.target,
		TargetTopic: func(string) string { return kafkaTopic },
	}}}
	for i, name := range f.names {
		fc.Sources = append(fc.Sources, pipeline.Source{Name: strings.ReplaceAll(name, "_", "-"), Pool: f.relay[i]})
	}
	if f.fleet, err = pipeline.NewFleet(fc, nil); err != nil {
		return err
	}
	f.done = make(chan error, 1)
	go func() { f.done <- f.fleet.Run(context.Background()) }()
	return nil
}

// drop stops the fleet, closes the pools and drops the databases.
func (b *bench) dropSources(f *fleetDBs) {
	if f.fleet != nil {
		_ = f.fleet.Close()
		if err := <-f.done; err != nil {
			logf("warning: the fleet: %v", err)
		}
	}
	if f.target != nil {
		_ = f.target.Close()
	}
	for _, p := range append(f.relay, f.pubs...) {
		p.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, name := range f.names {
		if _, err := b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			logf("warning: drop database %s: %v", name, err)
		}
	}
}

// connections counts the client connections to the databases named
// prefix_*.
func (b *bench) connections(ctx context.Context, prefix string) int {
	var n int
	_ = b.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname LIKE $1`,
		prefix+`\_%`).Scan(&n)
	return n
}

// sourcesPhase runs the throughput runs and the many-sources run: for each
// count, the same total load split among the sources (unpaced), and the
// same load per source (-sources-rate msg/s offered to each for
// -sources-duration).
func (b *bench) sourcesPhase(ctx context.Context, res *results) error {
	res.Sources = &sourcesResult{}
	pubs := b.cfg.sourcesPublishers
	for _, load := range []string{loadTotal, loadPerSource} {
		for _, n := range b.cfg.sourcesCounts {
			each, workers, rate := b.cfg.messages/n, max(1, pubs/n), 0.0
			if load == loadPerSource {
				rate = b.cfg.sourcesRate
				each, workers = int(rate*b.cfg.sourcesDuration.Seconds()), max(1, pubs/slices.Max(b.cfg.sourcesCounts))
			}
			r, err := b.runSources(ctx, load, n, each, workers, rate)
			if err != nil {
				return fmt.Errorf("%d sources, %s: %w", n, load, err)
			}
			res.Sources.Runs = append(res.Sources.Runs, r)
		}
	}
	if b.cfg.sourcesIdle > 0 {
		r, err := b.runManySources(ctx, b.cfg.sourcesIdle)
		if err != nil {
			return fmt.Errorf("%d idle sources: %w", b.cfg.sourcesIdle, err)
		}
		res.Sources.Idle = r
	}
	return nil
}

// runSources is one throughput run over n sources: each gets perSource
// messages from workers publishers, at rate msg/s (0: as fast as they
// go).
func (b *bench) runSources(ctx context.Context, loadName string, n, perSource, workers int, rate float64) (*sourcesRun, error) {
	cfg := b.cfg
	tag := map[string]string{loadTotal: "t", loadPerSource: "e"}[loadName]
	prefix := fmt.Sprintf("src%s%d", tag, n)
	kafkaTopic := fmt.Sprintf("sources-%s-%d", tag, n)
	kb, err := newBroker(cfg.partitions, false, kafkaTopic)
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	bulkhead, _ := tune.Lookup(adaptive.Default().ProfileName())
	f, err := b.createSources(ctx, prefix, n, cfg.partitions, bulkhead.MaxConcurrentPartitions+4, workers)
	defer b.dropSources(f)
	if err != nil {
		return nil, err
	}
	if err := f.startFleet(kb.addrs, kafkaTopic); err != nil {
		return nil, err
	}
	for _, p := range f.pubs { // connected before the clock starts
		if err := p.Ping(ctx); err != nil {
			return nil, err
		}
	}
	if err := b.beforeRun(ctx); err != nil {
		return nil, err
	}
	perTx := cfg.sourcesPerTx
	txs := max(1, perSource/perTx) // per source
	r := &sourcesRun{Load: loadName, OfferedPerSource: rate, Sources: n, Messages: txs * perTx * n, PerTx: perTx, Publishers: workers * n}
	logf("sources %d, %s: publishing %d messages (%d per database) in transactions of %d, %d publishers per database, the fleet running",
		n, loadName, r.Messages, txs*perTx, perTx, workers)
	cpu0, t0 := readCPU(b.postmaster), time.Now()
	pubDone := make(chan error, 1)
	go func() {
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			l := &load{sys: &system{publish: contextPublish(f.pub)}, pool: f.pubs[i], perTx: perTx, workers: workers, t0: t0}
			jobs := unpaced(ctx, txs, nil)
			if rate > 0 {
				jobs = paced(ctx, t0, t0, txs, rate/float64(perTx))
			}
			wg.Go(func() { errs <- b.publish(ctx, l, jobs) })
		}
		wg.Wait()
		close(errs)
		var first error
		for err := range errs {
			if err != nil && first == nil {
				first = err
			}
		}
		pubDone <- first
	}()
	var deadline time.Time
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var at int64
	for {
		select {
		case err := <-pubDone:
			if err != nil {
				return nil, fmt.Errorf("publish: %w", err)
			}
			pubDone, deadline = nil, time.Now().Add(cfg.maxDrain)
		case <-tick.C:
		}
		if at, err = kb.counter.Count(ctx, kafkaTopic); err != nil {
			return nil, err
		}
		if at >= int64(r.Messages) {
			r.Complete = true
			break
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			logf("sources %d: gave up after -max-drain %v with %d of %d at the broker", n, cfg.maxDrain, at, r.Messages)
			break
		}
	}
	cpu1 := readCPU(b.postmaster)
	r.Seconds = time.Since(t0).Seconds()
	r.Rate = float64(at) / r.Seconds
	r.ProcessMicrosPerMessage = (cpu1.process - cpu0.process).Seconds() * 1e6 / float64(max(1, at))
	r.PostgresMicrosPerMessage = (cpu1.server - cpu0.server).Seconds() * 1e6 / float64(max(1, at))
	r.Connections = b.connections(ctx, prefix)
	var sends, sent, passes, rows int64
	for _, st := range f.fleet.Status() {
		sends, sent = sends+st.Stats.Forwarder.Batches, sent+st.Stats.Forwarder.Messages
		passes, rows = passes+st.Stats.Sequencer.Passes, rows+st.Stats.Sequencer.Sequenced
	}
	r.MessagesPerSend = float64(sent) / float64(max(1, sends))
	r.RowsPerPass = float64(rows) / float64(max(1, passes))
	logf("sources %d, %s: %d at the broker in %.2f s: %.0f msg/s end to end; CPU per message %.0f µs (process %.0f, PostgreSQL %.0f); %d connections; %.1f messages per Kafka transaction, %.1f per sequencer pass",
		n, loadName, at, r.Seconds, r.Rate, r.ProcessMicrosPerMessage+r.PostgresMicrosPerMessage, r.ProcessMicrosPerMessage, r.PostgresMicrosPerMessage,
		r.Connections, r.MessagesPerSend, r.RowsPerPass)
	return r, nil
}

// contextPublish is a system's publish of a context-bound Publisher.
func contextPublish(pub *outbox.Publisher) func(context.Context, pgx.Tx, []*message.Message) error {
	return func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		txCtx := outbox.WithTx(ctx, tx)
		for _, m := range msgs {
			m.SetContext(txCtx)
		}
		return pub.Publish(outboxTopic, msgs...)
	}
}

// runManySources measures one fleet over n databases (4 partitions each):
// idle, then with a trickle into each.
func (b *bench) runManySources(ctx context.Context, n int) (*sourcesIdle, error) {
	const partitions = 4
	prefix := "many"
	kafkaTopic := "sources-many"
	kb, err := newBroker(partitions, false, kafkaTopic)
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	logf("sources: creating %d databases for the many-sources run", n)
	// The relay's pools as `outbox pipeline --config` opens them: pgxpool's
	// default size.
	f, err := b.createSources(ctx, prefix, n, partitions, 4, 1)
	defer b.dropSources(f)
	if err != nil {
		return nil, err
	}
	if _, err := kb.counter.Count(ctx, kafkaTopic); err != nil { // its consumer reads from now on
		return nil, err
	}
	settle := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		return b.beforeRun(ctx)
	}
	wait := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		return nil
	}
	d := b.cfg.idleDuration
	r := &sourcesIdle{Sources: n, Seconds: d.Seconds(), Settle: b.cfg.sourcesSettle.Seconds(), TricklePerSource: b.cfg.sourcesTrickle, Breakdown: &idleBreakdown{}}
	// The databases without a fleet: the floor.
	if err := settle(5 * time.Second); err != nil {
		return nil, err
	}
	c0 := readCPU(b.postmaster)
	if err := wait(d); err != nil {
		return nil, err
	}
	c1 := readCPU(b.postmaster)
	r.Breakdown.NoFleetProcessMillisPerSecond = (c1.process - c0.process).Seconds() * 1e3 / d.Seconds()
	r.Breakdown.NoFleetPostgresMillisPerSecond = (c1.server - c0.server).Seconds() * 1e3 / d.Seconds()
	logf("sources %d without a fleet: %.1f ms CPU per second (process %.1f + PostgreSQL %.1f)", n,
		r.Breakdown.NoFleetProcessMillisPerSecond+r.Breakdown.NoFleetPostgresMillisPerSecond, r.Breakdown.NoFleetProcessMillisPerSecond, r.Breakdown.NoFleetPostgresMillisPerSecond)

	if err := f.startFleet(kb.addrs, kafkaTopic); err != nil {
		return nil, err
	}
	if err := settle(b.cfg.sourcesSettle); err != nil {
		return nil, err
	}
	stopProfile := func() {}
	if b.cfg.sourcesIdleProfile != "" {
		stop, err := startCPUProfile(b.cfg.sourcesIdleProfile)
		if err != nil {
			return nil, err
		}
		var once sync.Once
		stopProfile = func() { once.Do(stop) }
		defer stopProfile()
	}
	backends := b.sourceBackends(ctx, prefix)
	p0 := processCPU(backends)
	c0 = readCPU(b.postmaster)
	if err := wait(d); err != nil {
		return nil, err
	}
	c1 = readCPU(b.postmaster)
	p1 := processCPU(backends)
	stopProfile()
	r.IdleProcessMillisPerSecond = (c1.process - c0.process).Seconds() * 1e3 / d.Seconds()
	r.IdlePostgresMillisPerSecond = (c1.server - c0.server).Seconds() * 1e3 / d.Seconds()
	r.IdleConnections = b.connections(ctx, prefix)
	r.Breakdown.BackendsMillisPerSecond = backendsCPU(p0, p1).Seconds() * 1e3 / d.Seconds()
	r.Breakdown.Connections = b.sourceConnections(ctx, prefix)
	r.Breakdown.Statements, r.Breakdown.StatementsPerSecond = b.sourceStatements(ctx, prefix, n, d)
	r.Statements = b.topStatements(ctx)
	logf("sources %d idle: %.1f ms CPU per second (process %.1f + PostgreSQL %.1f, of which the sources' backends %.1f), %d connections, %.2f statements/s per source",
		n, r.IdleProcessMillisPerSecond+r.IdlePostgresMillisPerSecond, r.IdleProcessMillisPerSecond, r.IdlePostgresMillisPerSecond,
		r.Breakdown.BackendsMillisPerSecond, r.IdleConnections, r.Breakdown.StatementsPerSecond)
	for _, c := range r.Breakdown.Connections {
		logf("  %3d connections %s: %s", c.Count, c.State, c.Query)
	}
	for _, s := range r.Breakdown.Statements {
		logf("  %7.3f/s per source, %8.1f ms: %s", s.CallsPerSecond, s.TotalMs, s.Query)
	}

	// The trickle: each database gets a one-message transaction every
	// 1/rate s, from one publisher each.
	if b.cfg.sourcesTrickle <= 0 {
		return r, nil
	}
	tctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	every := time.Duration(float64(time.Second) / b.cfg.sourcesTrickle)
	var wg sync.WaitGroup
	var published sync.Map
	c0 = readCPU(b.postmaster)
	for i := range n {
		l := &load{sys: &system{publish: contextPublish(f.pub)}, pool: f.pubs[i], perTx: 1, workers: 1, t0: time.Now()}
		published.Store(i, l)
		wg.Go(func() {
			jobs := make(chan txJob)
			go func() {
				defer close(jobs)
				t := time.NewTicker(every)
				defer t.Stop()
				for j := 0; ; j++ {
					select {
					case <-tctx.Done():
						return
					case <-t.C:
					}
					select {
					case jobs <- txJob{index: j}:
					case <-tctx.Done():
						return
					}
				}
			}()
			if err := b.publish(tctx, l, jobs); err != nil && tctx.Err() == nil {
				logf("warning: the trickle into %s: %v", f.names[i], err)
			}
		})
	}
	wg.Wait()
	c1 = readCPU(b.postmaster)
	r.TrickleProcessMillisPerSecond = (c1.process - c0.process).Seconds() * 1e3 / d.Seconds()
	r.TricklePostgresMillisPerSecond = (c1.server - c0.server).Seconds() * 1e3 / d.Seconds()
	published.Range(func(_, v any) bool {
		r.TricklePublished += v.(*load).published.Load()
		return true
	})
	// What is under way arrives.
	for wait := time.Now().Add(5 * time.Second); time.Now().Before(wait) && r.TrickleDelivered < r.TricklePublished; time.Sleep(100 * time.Millisecond) {
		r.TrickleDelivered, _ = kb.counter.Count(ctx, kafkaTopic)
	}
	logf("sources %d with %.1f msg/s each: %.1f ms CPU per second (process %.1f + PostgreSQL %.1f); %d of %d at the broker",
		n, b.cfg.sourcesTrickle, r.TrickleProcessMillisPerSecond+r.TricklePostgresMillisPerSecond, r.TrickleProcessMillisPerSecond,
		r.TricklePostgresMillisPerSecond, r.TrickleDelivered, r.TricklePublished)
	return r, nil
}

// settled says how long the fleet ran before the idle window.
func settled(s float64) string {
	if s == 0 {
		s = 5
	}
	return fmt.Sprintf(", the idle window %.0f s after the fleet started", s)
}

// sourcesMarkdown renders the sources phase.
func (res *results) sourcesMarkdown(sb *strings.Builder) {
	s := res.Sources
	if s == nil {
		return
	}
	fmt.Fprintf(sb, "## Sources: one fleet over several databases\n\n")
	fmt.Fprintf(sb, "A `pipeline.Fleet` over N databases of the one PostgreSQL server (each with the topic in %v partitions), exactly once into one Kafka topic. *Same total*: the messages and publishers split among the sources, published as fast as they go; *same per source*: each source offered the same rate (column *offered*), paced. CPU per message: this process (publishers, fleet, in-process broker) + PostgreSQL.\n\n", res.Config["partitions"])
	if len(s.Runs) > 0 {
		sb.WriteString("| load | sources | offered msg/s per source | messages | msg/tx | publishers | msg/s end to end | CPU µs/msg (process + PostgreSQL) | msg per Kafka tx | rows per sequencer pass | connections | complete |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, r := range s.Runs {
			offered := "as fast as it goes"
			if r.OfferedPerSource > 0 {
				offered = fmt.Sprintf("%.0f", r.OfferedPerSource)
			}
			fmt.Fprintf(sb, "| %s | %d | %s | %d | %d | %d | %.0f | %.0f (%.0f + %.0f) | %.1f | %.1f | %d | %v |\n", r.Load, r.Sources, offered, r.Messages, r.PerTx, r.Publishers, r.Rate,
				r.ProcessMicrosPerMessage+r.PostgresMicrosPerMessage, r.ProcessMicrosPerMessage, r.PostgresMicrosPerMessage,
				r.MessagesPerSend, r.RowsPerPass, r.Connections, r.Complete)
		}
		sb.WriteString("\n")
	}
	if i := s.Idle; i != nil {
		fmt.Fprintf(sb, "**%d sources, one fleet** (4 partitions each, pools of 4 connections as `outbox pipeline --config` opens them), over %.0f s each%s:\n\n", i.Sources, i.Seconds, settled(i.Settle))
		sb.WriteString("| load | CPU ms/s (process + PostgreSQL) | connections |\n|---|---:|---:|\n")
		fmt.Fprintf(sb, "| idle | %.1f (%.1f + %.1f) | %d |\n", i.IdleProcessMillisPerSecond+i.IdlePostgresMillisPerSecond, i.IdleProcessMillisPerSecond, i.IdlePostgresMillisPerSecond, i.IdleConnections)
		if i.TricklePerSource > 0 {
			fmt.Fprintf(sb, "| %.1f msg/s into each (%d published, %d at the broker) | %.1f (%.1f + %.1f) | |\n", i.TricklePerSource, i.TricklePublished, i.TrickleDelivered,
				i.TrickleProcessMillisPerSecond+i.TricklePostgresMillisPerSecond, i.TrickleProcessMillisPerSecond, i.TricklePostgresMillisPerSecond)
		}
		sb.WriteString("\n")
		if i.Breakdown != nil {
			i.Breakdown.markdown(sb, i.Sources, i.IdleProcessMillisPerSecond+i.IdlePostgresMillisPerSecond)
		}
	}
}
