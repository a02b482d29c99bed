package main

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/retention"
)

// The growth runs' workload: unpaced publishers, 100 messages per
// transaction.
const (
	growthPublishers = 4
	growthPerTx      = 100
	// vacuumInterval is the retention Vacuum's pause between passes.
	vacuumInterval = time.Second
)

// growthResult holds the growth phase: the history run and the partitions
// sweep.
type growthResult struct {
	History *historyResult `json:"history,omitempty"`
	// HistoryPaced is the history run again at a fixed offered load.
	HistoryPaced *historyResult `json:"history_paced,omitempty"`
	Partitions   []*growthRun   `json:"partitions,omitempty"`
}

// growthRun is the outcome of one growth run of (c): a fresh schema and
// broker, the relay running (default tuning), growthPublishers unpaced
// publishers, a consumer that measures latency and deletes what it
// consumed from the broker.
type growthRun struct {
	Partitions int   `json:"partitions"`
	Messages   int   `json:"messages"`
	PerTx      int   `json:"per_tx"`
	Publishers int   `json:"publishers"`
	Complete   bool  `json:"complete"`
	Delivered  int64 `json:"delivered"`
	Duplicates int64 `json:"duplicates"`
	// Seconds: from the first publish until the last message arrived.
	Seconds             float64      `json:"seconds"`
	PublishRate         float64      `json:"publish_msgs_per_s"`
	EndToEndRate        float64      `json:"end_to_end_msgs_per_s"`
	Latency             latencyStats `json:"latency"`
	CPUSeconds          float64      `json:"cpu_s"`
	CPUMicrosPerMessage float64      `json:"cpu_us_per_msg"`
	PeakRSSBytes        int64        `json:"peak_rss_bytes"`
	BrokerTrimErrors    int64        `json:"broker_trim_errors,omitempty"`
	Statements          []statement  `json:"top_statements,omitempty"`
}

// historyResult is the history run: a growthRun with the retention Vacuum
// on, and a point every 10% of the messages delivered.
type historyResult struct {
	growthRun
	// MaxBacklog is -growth-max-backlog (0: unpaced).
	MaxBacklog int `json:"max_backlog"`
	// OfferedRate is the paced run's load in msg/s (0: not paced).
	OfferedRate   int            `json:"offered_msgs_per_s,omitempty"`
	VacuumDeleted int64          `json:"vacuum_deleted"`
	Points        []historyPoint `json:"points"`
}

// historyPoint is the state of the history run when Delivered messages had
// arrived; the window figures cover the messages that arrived since the
// previous point.
type historyPoint struct {
	Delivered      int64   `json:"delivered"`
	Published      int64   `json:"published"`
	Seconds        float64 `json:"seconds"`
	WindowSeconds  float64 `json:"window_s"`
	WindowMessages int     `json:"window_messages"`
	WindowRate     float64 `json:"window_msgs_per_s"`
	WindowP50Ms    float64 `json:"window_p50_ms"`
	WindowP99Ms    float64 `json:"window_p99_ms"`
	// Backlog is published − delivered.
	Backlog        int64 `json:"backlog"`
	RSSBytes       int64 `json:"rss_bytes"`
	HeapInuseBytes int64 `json:"heap_inuse_bytes"`
	LogRows        int64 `json:"log_rows"`
	PendingRows    int64 `json:"pending_rows"`
	LogBytes       int64 `json:"log_bytes"`
	PendingBytes   int64 `json:"pending_bytes"`
	VacuumDeleted  int64 `json:"vacuum_deleted"`
}

// growthPhase runs the history run and the partitions sweep.
func (b *bench) growthPhase(ctx context.Context, res *results) error {
	res.Growth = &growthResult{}
	h, err := b.runHistory(ctx, 0)
	if h != nil {
		res.Growth.History = h
	}
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	if b.cfg.growthRate > 0 {
		h, err := b.runHistory(ctx, b.cfg.growthRate)
		if h != nil {
			res.Growth.HistoryPaced = h
		}
		if err != nil {
			return fmt.Errorf("history at %d msg/s: %w", b.cfg.growthRate, err)
		}
	}
	for _, p := range b.cfg.growthPartitions {
		r, err := b.runTracked(ctx, trackedSpec{
			label:      fmt.Sprintf("growth %d partitions", p),
			name:       fmt.Sprintf("growth_p%d", p),
			partitions: p,
			messages:   b.cfg.growthMessages,
		})
		if err != nil {
			return fmt.Errorf("%d partitions: %w", p, err)
		}
		res.Growth.Partitions = append(res.Growth.Partitions, r)
	}
	return nil
}

// runHistory publishes -growth-history messages into one topic of
// -partitions partitions with the retention Vacuum running, and records a
// point every 10% delivered (and one before the start). rate > 0 offers a
// fixed load of rate msg/s instead of publishing as fast as possible.
func (b *bench) runHistory(ctx context.Context, rate int) (*historyResult, error) {
	h := &historyRecorder{b: b, ctx: ctx, res: &historyResult{MaxBacklog: b.cfg.growthMaxBacklog, OfferedRate: rate}, step: int64(b.cfg.growthHistory / 10)}
	label, name := "history", "growth_history"
	if rate > 0 {
		label, name = fmt.Sprintf("history at %d msg/s", rate), fmt.Sprintf("growth_history_r%d", rate)
	}
	r, err := b.runTracked(ctx, trackedSpec{
		label:      label,
		name:       name,
		rate:       rate,
		partitions: b.cfg.partitions,
		messages:   b.cfg.growthHistory,
		vacuum:     true,
		maxBacklog: b.cfg.growthMaxBacklog,
		tick:       h.tick,
		end:        h.end,
	})
	if r != nil {
		h.res.growthRun = *r
	}
	if err == nil {
		err = h.err
	}
	return h.res, err
}

// historyRecorder takes the history run's points.
type historyRecorder struct {
	b    *bench
	ctx  context.Context
	res  *historyResult
	step int64 // a point every step delivered
	next int64 // the next point is due at this many delivered
	err  error // of the first point that failed

	prevAt        time.Time
	prevDelivered int64
}

// tick takes a point when the next 10% have been delivered (the last one
// is taken by end, once everything has arrived).
func (h *historyRecorder) tick(tr *tracked, now time.Time) {
	if h.err == nil && tr.cons.received.Load() >= h.next && h.next < int64(tr.messages) {
		h.err = h.point(tr, now)
	}
}

func (h *historyRecorder) end(tr *tracked, now time.Time) {
	if h.err == nil && tr.cons.received.Load() > h.prevDelivered {
		h.err = h.point(tr, now)
	}
	if tr.vacuum != nil {
		h.res.VacuumDeleted = tr.vacuum.Stats().Deleted
	}
}

// point records the state of the run now.
func (h *historyRecorder) point(tr *tracked, now time.Time) error {
	delivered := tr.cons.received.Load()
	p := historyPoint{
		Delivered: delivered, Published: tr.load.published.Load(), Seconds: now.Sub(tr.t0).Seconds(),
		RSSBytes: currentRSS(), HeapInuseBytes: heapInuse(),
	}
	p.Backlog = p.Published - p.Delivered
	if tr.vacuum != nil {
		p.VacuumDeleted = tr.vacuum.Stats().Deleted
	}
	if !h.prevAt.IsZero() {
		w := tr.cons.takeWindow()
		sortInt64s(w)
		p.WindowSeconds = now.Sub(h.prevAt).Seconds()
		p.WindowMessages = len(w)
		p.WindowRate = float64(delivered-h.prevDelivered) / max(p.WindowSeconds, 1e-3)
		p.WindowP50Ms, p.WindowP99Ms = ms(percentile(w, 0.5)), ms(percentile(w, 0.99))
	}
	if err := h.b.admin.QueryRow(h.ctx, sqlFor(tr.schema, `SELECT
		(SELECT count(*) FROM {{s}}.log), (SELECT count(*) FROM {{s}}.pending),
		pg_total_relation_size('{{s}}.log'), pg_total_relation_size('{{s}}.pending')`)).Scan(
		&p.LogRows, &p.PendingRows, &p.LogBytes, &p.PendingBytes); err != nil {
		return err
	}
	h.prevAt, h.prevDelivered = now, delivered
	h.next = (delivered/h.step + 1) * h.step
	h.res.Points = append(h.res.Points, p)
	logf("history: %7d delivered (%3.0f%%)  window %6.0f msg/s, p50 %6.1f ms, p99 %7.1f ms  backlog %6d  RSS %4d MiB  heap %4d MiB  log %7d rows %5d MiB  pending %6d rows %4d MiB  vacuumed %d",
		p.Delivered, 100*float64(p.Delivered)/float64(tr.messages), p.WindowRate, p.WindowP50Ms, p.WindowP99Ms, p.Backlog,
		p.RSSBytes>>20, p.HeapInuseBytes>>20, p.LogRows, p.LogBytes>>20, p.PendingRows, p.PendingBytes>>20, p.VacuumDeleted)
	return nil
}

// trackedSpec describes a growth run for runTracked.
type trackedSpec struct {
	label      string
	name       string // of the schema and the Kafka topic
	partitions int
	messages   int
	// vacuum runs a retention Vacuum (interval vacuumInterval).
	vacuum bool
	// maxBacklog, when positive, holds the publishers back while more
	// than that many messages are published but not at the consumer.
	maxBacklog int
	// rate, when positive, paces the publishers at rate msg/s (maxBacklog
	// is then ignored).
	rate int
	// perTx and publishers: messages per transaction and publisher
	// goroutines (0: growthPerTx and growthPublishers).
	perTx, publishers int
	// keepFor is the retention Vacuum's KeepFor (0: its default).
	keepFor time.Duration
	// prepare, when not nil, runs once the schema is migrated, before
	// anything starts.
	prepare func(ctx context.Context, schema string) error
	// tick is called every 100 ms (and once before publishing starts);
	// end once after the last message arrived. Without tick, progress is
	// logged every 2 s.
	tick, end func(tr *tracked, now time.Time)
}

// tracked is what a trackedSpec's callbacks see of a running growth run.
type tracked struct {
	t0       time.Time
	schema   string
	messages int
	load     *load
	cons     *consumer
	vacuum   *retention.Vacuum
}

// runTracked runs one growth run of (c) as spec says.
func (b *bench) runTracked(ctx context.Context, spec trackedSpec) (*growthRun, error) {
	schema, topic := spec.name, spec.name
	kb, sys, err := b.freshSystem(ctx, sysOutbox, schema, topic, spec.partitions, true, adaptive.Default())
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	defer sys.stop()
	if spec.prepare != nil {
		if err := spec.prepare(ctx, schema); err != nil {
			return nil, err
		}
	}
	if err := sys.start(ctx); err != nil {
		return nil, fmt.Errorf("start the relay: %w", err)
	}
	perTx, publishers := cmp.Or(spec.perTx, growthPerTx), cmp.Or(spec.publishers, growthPublishers)
	var vac *retention.Vacuum
	if spec.vacuum {
		v, stop, err := b.startVacuum(ctx, schema, spec.keepFor)
		if err != nil {
			return nil, err
		}
		defer stop()
		vac = v
	}
	pool, err := b.warmPool(ctx, publishers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	txs := (spec.messages + perTx - 1) / perTx
	r := &growthRun{Partitions: spec.partitions, Messages: txs * perTx, PerTx: perTx, Publishers: publishers}
	commits := make([]atomic.Int64, r.Messages)
	prefault(commits)
	if err := b.beforeRun(ctx); err != nil {
		return nil, err
	}
	logf("%s: %d messages into %d partitions, %d per transaction, %d publishers%s%s", spec.label, r.Messages, spec.partitions, perTx, publishers,
		map[bool]string{true: ", retention Vacuum every " + vacuumInterval.String(), false: ""}[spec.vacuum],
		map[bool]string{true: fmt.Sprintf(", at most %d undelivered", spec.maxBacklog), false: ""}[spec.maxBacklog > 0])

	cpu0 := readCPU(b.postmaster)
	t0 := time.Now()
	cons, err := startConsumer(kb.addrs, topic, t0, commits, true)
	if err != nil {
		return nil, err
	}
	defer cons.Close()
	l := &load{sys: sys, pool: pool, perTx: perTx, workers: publishers, t0: t0, tag: true, commits: commits}
	tr := &tracked{t0: t0, schema: schema, messages: r.Messages, load: l, cons: cons, vacuum: vac}
	if spec.tick != nil {
		spec.tick(tr, t0)
	}
	pubDone := make(chan error, 1)
	jobs := unpaced(ctx, txs, backlogHold(l, cons, spec.maxBacklog))
	if spec.rate > 0 {
		jobs = paced(ctx, t0, t0, txs, float64(spec.rate)/float64(perTx))
	}
	go func() { pubDone <- b.publish(ctx, l, jobs) }()
	lastLog := t0
	end, complete, err := b.watch(ctx, cons, int64(r.Messages), pubDone, func(now time.Time) {
		if spec.tick != nil {
			spec.tick(tr, now)
		}
		if spec.tick == nil && now.Sub(lastLog) >= 2*time.Second {
			lastLog = now
			logf("%s: %5.1f s  published %d  delivered %d", spec.label, now.Sub(t0).Seconds(), l.published.Load(), cons.received.Load())
		}
	})
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	if spec.end != nil {
		spec.end(tr, end)
	}
	r.finish(cpu0, readCPU(b.postmaster), cons, l, complete, end.Sub(t0))
	r.Statements = b.topStatements(ctx)
	logf("%s: %d of %d delivered in %.2f s: %.0f msg/s end to end (publish %.0f msg/s); latency p50 %.1f ms, p99 %.1f ms; CPU %.1f µs/msg; peak RSS %d MiB%s",
		spec.label, r.Delivered, r.Messages, r.Seconds, r.EndToEndRate, r.PublishRate, r.Latency.P50Ms, r.Latency.P99Ms, r.CPUMicrosPerMessage, r.PeakRSSBytes>>20,
		map[bool]string{true: "", false: "; INCOMPLETE after -max-drain"}[complete])
	return r, nil
}

// backlogHold returns a hold for unpaced that waits while more than
// maxBacklog messages are committed but not at the consumer; nil (no
// holding) when maxBacklog is 0.
func backlogHold(l *load, cons *consumer, maxBacklog int) func(context.Context) bool {
	if maxBacklog <= 0 {
		return nil
	}
	return func(ctx context.Context) bool {
		for l.published.Load()-cons.received.Load() > int64(maxBacklog) {
			if ctx.Err() != nil {
				return false
			}
			time.Sleep(time.Millisecond)
		}
		return true
	}
}

// startVacuum runs a retention Vacuum on schema (interval vacuumInterval,
// KeepFor keepFor, 0: its default) with a pool of its own; stop stops it.
func (b *bench) startVacuum(ctx context.Context, schema string, keepFor time.Duration) (vac *retention.Vacuum, stop func(), err error) {
	pool, err := b.pool(ctx, 2)
	if err != nil {
		return nil, nil, err
	}
	if vac, err = retention.NewVacuum(retention.Config{Schema: schema, Pool: pool, Interval: vacuumInterval, KeepFor: keepFor}, nil); err != nil {
		pool.Close()
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = vac.Run(context.Background())
	}()
	return vac, func() {
		_ = vac.Close()
		<-done
		pool.Close()
	}, nil
}

// finish fills in the figures of a growth run that ended at elapsed since
// its first publish.
func (r *growthRun) finish(c0, c1 cpuSample, cons *consumer, l *load, complete bool, elapsed time.Duration) {
	r.Complete, r.Delivered, r.Duplicates = complete, cons.received.Load(), cons.duplicates.Load()
	r.Seconds = elapsed.Seconds()
	if complete {
		r.Seconds = time.Duration(cons.lastRecv.Load()).Seconds()
	}
	r.EndToEndRate = float64(r.Delivered) / r.Seconds
	r.PublishRate = float64(l.published.Load()) / time.Duration(l.lastCommit.Load()).Seconds()
	r.Latency = summarize(cons.latencies())
	r.CPUSeconds = c1.total() - c0.total()
	r.CPUMicrosPerMessage = r.CPUSeconds * 1e6 / float64(r.Messages)
	r.PeakRSSBytes = peakRSS()
	r.BrokerTrimErrors = cons.trimErrors.Load()
}
