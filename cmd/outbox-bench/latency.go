package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/millrace/watermill-outbox/adaptive"
)

// latencyWarmup is how long after the consumer starts the first
// transaction is due: time for the consumer to find the topic and wait.
const latencyWarmup = 300 * time.Millisecond

// latencyResult is one system at one offered load.
type latencyResult struct {
	System string `json:"system"`
	// Tuning is the relay's tuning for (c).
	Tuning      string  `json:"tuning,omitempty"`
	OfferedRate int     `json:"offered_msgs_per_s"`
	PerTx       int     `json:"per_tx"`
	TxPerSecond float64 `json:"tx_per_s"`
	Seconds     float64 `json:"duration_s"`
	Publishers  int     `json:"publishers"`
	Messages    int     `json:"messages"`
	Received    int64   `json:"received"`
	Duplicates  int64   `json:"duplicates"`
	// Complete is false when not every message reached the consumer
	// within -max-drain.
	Complete bool `json:"complete"`
	// AchievedRate is messages ÷ (last COMMIT − first due time).
	AchievedRate float64 `json:"achieved_msgs_per_s"`
	// KeptSchedule: the publishers reached at least 97% of the offered
	// rate. Lag is how late publishers took transactions up.
	KeptSchedule bool    `json:"kept_schedule"`
	LagP99Ms     float64 `json:"schedule_lag_p99_ms"`
	LagMaxMs     float64 `json:"schedule_lag_max_ms"`
	// DrainSeconds: from the last COMMIT until the last message arrived.
	DrainSeconds        float64      `json:"drain_after_last_commit_s"`
	Latency             latencyStats `json:"latency"`
	CPUSeconds          float64      `json:"cpu_s"`
	CPUMicrosPerMessage float64      `json:"cpu_us_per_msg"`
	// ProcessMicrosPerMessage and PostgresMicrosPerMessage split
	// CPUMicrosPerMessage: this process (publishers, relay, the in-process
	// Kafka broker and consumer) and the PostgreSQL server.
	ProcessMicrosPerMessage  float64 `json:"process_cpu_us_per_msg"`
	PostgresMicrosPerMessage float64 `json:"postgres_cpu_us_per_msg"`
	PeakRSSBytes             int64   `json:"peak_rss_bytes"`
	// CDF is the latency distribution, for latency.png.
	CDF        []cdfPoint  `json:"cdf"`
	Statements []statement `json:"top_statements,omitempty"`
}

// latencyStats summarises commit→broker latencies.
type latencyStats struct {
	Count  int     `json:"count"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p99_9_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// cdfPoint: a fraction Frac of the messages had a latency ≤ Ms.
type cdfPoint struct {
	Ms   float64 `json:"ms"`
	Frac float64 `json:"frac"`
}

// latencyTxs is the number of transactions of an offered load of
// msgPerSec for d: max(1, msgPerSec/1000) messages per transaction.
func latencyTxs(msgPerSec int, d time.Duration) int {
	perTx := max(1, msgPerSec/1000)
	return int(float64(msgPerSec) / float64(perTx) * d.Seconds())
}

// latencyPhase runs (b), (d) when -systems names it, and (c) at each
// offered load of -latency-loads.
func (b *bench) latencyPhase(ctx context.Context, res *results) error {
	type run struct {
		name          string
		defaultTuning bool // (c) or (e) with adaptive.Default() instead of LowLatency()
	}
	runs := []run{{name: sysPeer}}
	for _, peer := range []string{sysPeerTuned, sysRiver} {
		if slices.Contains(b.cfg.systems, peer) {
			runs = append(runs, run{name: peer})
		}
	}
	runs = append(runs, run{name: sysOutbox}, run{name: sysOutbox, defaultTuning: true})
	if slices.Contains(b.cfg.systems, sysOutboxALO) {
		runs = append(runs, run{name: sysOutboxALO})
	}
	if slices.Contains(b.cfg.systems, sysOutboxWAL) {
		runs = append(runs, run{name: sysOutboxWAL}, run{name: sysOutboxWAL, defaultTuning: true})
	}
	for _, load := range b.cfg.latencyLoads {
		// The physical limit of the work at this load: the publish alone,
		// a plain INSERT per message, nothing forwarded.
		cr, err := b.runLatencyCeiling(ctx, load)
		if err != nil {
			return fmt.Errorf("%s at %d msg/s: %w", sysCeiling, load, err)
		}
		res.Latency = append(res.Latency, cr)
		for _, r := range runs {
			tuning := adaptive.LowLatency()
			if r.defaultTuning {
				tuning = adaptive.Default()
			}
			lr, err := b.runLatency(ctx, r.name, load, tuning, r.defaultTuning)
			if err != nil {
				return fmt.Errorf("%s at %d msg/s: %w", r.name, load, err)
			}
			res.Latency = append(res.Latency, lr)
		}
	}
	return nil
}

// runLatency offers msgPerSec to system name for -latency-duration, open
// loop: transactions are due at fixed times and taken up by
// -latency-publishers goroutines. It measures each message's latency from
// COMMIT returning to its arrival at a consumer of the Kafka topic.
func (b *bench) runLatency(ctx context.Context, name string, msgPerSec int, tuning adaptive.Tuning, defaultTuning bool) (*latencyResult, error) {
	cfg := b.cfg
	suffix := ""
	if defaultTuning {
		suffix = "_default"
	}
	schema := fmt.Sprintf("lat_%s_%d%s", strings.ReplaceAll(name, "-", "_"), msgPerSec, suffix)
	topic := fmt.Sprintf("lat-%s-%d%s", name, msgPerSec, suffix)
	kb, sys, err := b.freshSystem(ctx, name, schema, topic, cfg.partitions, false, tuning)
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	defer sys.stop()
	if err := sys.start(ctx); err != nil {
		return nil, fmt.Errorf("start the relay: %w", err)
	}
	pool, err := b.warmPool(ctx, cfg.latencyPublishers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	r, txs := b.newLatencyResult(name, msgPerSec)
	switch {
	case defaultTuning:
		r.Tuning = "adaptive.Default()"
	case name == sysOutbox || name == sysOutboxALO || name == sysOutboxWAL:
		r.Tuning = "adaptive.LowLatency()"
	}
	commits := make([]atomic.Int64, r.Messages)
	lags := make([]int64, txs)
	if err := b.beforeRun(ctx); err != nil {
		return nil, err
	}
	label := fmt.Sprintf("latency %s at %d msg/s", name, msgPerSec)
	logf("%s: %d messages, %d per transaction, %.0f transactions/s for %v, %d publishers", label, r.Messages, r.PerTx, r.TxPerSecond, cfg.latencyDuration, cfg.latencyPublishers)

	cpu0 := readCPU(b.postmaster)
	t0 := time.Now()
	cons, err := startConsumer(kb.addrs, topic, t0, commits, false)
	if err != nil {
		return nil, err
	}
	defer cons.Close()
	l := &load{sys: sys, pool: pool, perTx: r.PerTx, workers: cfg.latencyPublishers, t0: t0, tag: true, commits: commits, lags: lags}
	pubDone := make(chan error, 1)
	go func() {
		pubDone <- b.publish(ctx, l, paced(ctx, t0, t0.Add(latencyWarmup), txs, r.TxPerSecond))
	}()
	lastLog := t0
	end, complete, err := b.watch(ctx, cons, int64(r.Messages), pubDone, func(now time.Time) {
		if now.Sub(lastLog) >= 2*time.Second {
			lastLog = now
			logf("%s: %5.1f s  committed %d  received %d", label, now.Sub(t0).Seconds(), l.published.Load(), cons.received.Load())
		}
	})
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	r.finish(cpu0, readCPU(b.postmaster), cons, l, complete, end.Sub(t0))
	r.Statements = b.topStatements(ctx)
	logf("%s: %s", label, r.summary())
	return r, nil
}

// runLatencyCeiling offers msgPerSec of plain INSERTs (system (a), a
// bare table, no relay, no broker) for -latency-duration, open loop as
// runLatency does, and measures the CPU per message of publishing alone:
// the ceiling the forwarding systems' CPU per message is judged against.
// It has no latency (nothing is delivered).
func (b *bench) runLatencyCeiling(ctx context.Context, msgPerSec int) (*latencyResult, error) {
	cfg := b.cfg
	schema := fmt.Sprintf("lat_ceiling_%d", msgPerSec)
	if err := b.createSchema(ctx, schema); err != nil {
		return nil, err
	}
	sys, err := b.setupCeiling(ctx, schema)
	if err != nil {
		return nil, err
	}
	defer sys.stop()
	pool, err := b.warmPool(ctx, cfg.latencyPublishers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	r, txs := b.newLatencyResult(sysCeiling, msgPerSec)
	lags := make([]int64, txs)
	if err := b.beforeRun(ctx); err != nil {
		return nil, err
	}
	label := fmt.Sprintf("latency %s at %d msg/s", sysCeiling, msgPerSec)
	logf("%s: %d messages, %d per transaction, %.0f transactions/s for %v, %d publishers (publish only)", label, r.Messages, r.PerTx, r.TxPerSecond, cfg.latencyDuration, cfg.latencyPublishers)
	cpu0 := readCPU(b.postmaster)
	t0 := time.Now()
	l := &load{sys: sys, pool: pool, perTx: r.PerTx, workers: cfg.latencyPublishers, t0: t0, lags: lags}
	if err := b.publish(ctx, l, paced(ctx, t0, t0.Add(latencyWarmup), txs, r.TxPerSecond)); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	cpu1 := readCPU(b.postmaster)
	r.Received = l.published.Load() // what is committed is all there is to have
	r.Complete = r.Received == int64(r.Messages)
	r.schedule(l)
	r.cpu(cpu0, cpu1)
	r.Statements = b.topStatements(ctx)
	logf("%s: %d of %d committed, %.0f msg/s; CPU %.1f µs/msg (process %.1f + PostgreSQL %.1f)", label, r.Received, r.Messages, r.AchievedRate, r.CPUMicrosPerMessage, r.ProcessMicrosPerMessage, r.PostgresMicrosPerMessage)
	return r, nil
}

// finish fills in the figures of a latency run that ended at
// elapsed since t0.
func (r *latencyResult) finish(c0, c1 cpuSample, cons *consumer, l *load, complete bool, elapsed time.Duration) {
	r.Received, r.Duplicates, r.Complete = cons.received.Load(), cons.duplicates.Load(), complete
	r.schedule(l)
	lastCommit := time.Duration(l.lastCommit.Load())
	last := time.Duration(cons.lastRecv.Load())
	if !complete {
		last = elapsed
	}
	r.DrainSeconds = max(0, (last - lastCommit).Seconds())
	lat := cons.latencies()
	r.Latency = summarize(lat)
	r.CDF = cdf(lat)
	r.cpu(c0, c1)
}

// newLatencyResult is the result of a latency run of system at msgPerSec
// for -latency-duration, before it runs, and its number of transactions.
func (b *bench) newLatencyResult(system string, msgPerSec int) (*latencyResult, int) {
	cfg := b.cfg
	perTx := max(1, msgPerSec/1000)
	txs := latencyTxs(msgPerSec, cfg.latencyDuration)
	return &latencyResult{
		System: system, OfferedRate: msgPerSec, PerTx: perTx, TxPerSecond: float64(msgPerSec) / float64(perTx),
		Seconds: cfg.latencyDuration.Seconds(), Publishers: cfg.latencyPublishers, Messages: txs * perTx,
	}, txs
}

// schedule fills in how well the publishers of l kept the schedule: the
// achieved rate and their lag behind it.
func (r *latencyResult) schedule(l *load) {
	if d := (time.Duration(l.lastCommit.Load()) - latencyWarmup).Seconds(); d > 0 {
		r.AchievedRate = float64(l.published.Load()) / d
	}
	r.KeptSchedule = r.AchievedRate >= 0.97*float64(r.OfferedRate)
	lags := slices.Clone(l.lags)
	sortInt64s(lags)
	r.LagP99Ms, r.LagMaxMs = ms(percentile(lags, 0.99)), ms(percentile(lags, 1))
}

// cpu fills in the CPU the run took between c0 and c1, per message, and
// the process's peak RSS.
func (r *latencyResult) cpu(c0, c1 cpuSample) {
	r.CPUSeconds = c1.total() - c0.total()
	r.CPUMicrosPerMessage = r.CPUSeconds * 1e6 / float64(r.Messages)
	r.ProcessMicrosPerMessage = (c1.process - c0.process).Seconds() * 1e6 / float64(r.Messages)
	r.PostgresMicrosPerMessage = (c1.server - c0.server).Seconds() * 1e6 / float64(r.Messages)
	r.PeakRSSBytes = peakRSS()
}

func (r *latencyResult) summary() string {
	s := fmt.Sprintf("%d of %d received (%d duplicates), offered %.0f msg/s; latency p50 %.1f ms, p90 %.1f, p99 %.1f, p99.9 %.1f, max %.1f; CPU %.1f µs/msg (process %.1f + PostgreSQL %.1f)",
		r.Received, r.Messages, r.Duplicates, r.AchievedRate, r.Latency.P50Ms, r.Latency.P90Ms, r.Latency.P99Ms, r.Latency.P999Ms, r.Latency.MaxMs, r.CPUMicrosPerMessage, r.ProcessMicrosPerMessage, r.PostgresMicrosPerMessage)
	if !r.KeptSchedule {
		s += fmt.Sprintf("; the publishers did not keep the schedule (lag p99 %.0f ms, max %.0f ms)", r.LagP99Ms, r.LagMaxMs)
	}
	if !r.Complete {
		s += "; INCOMPLETE after -max-drain"
	}
	return s
}

func sortInt64s(s []int64) { slices.Sort(s) }

// percentile is the nearest-rank percentile p (0..1] of sorted; 0 if empty.
func percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

// summarize returns the percentiles of sorted latencies (ns).
func summarize(sorted []int64) latencyStats {
	return latencyStats{
		Count: len(sorted),
		P50Ms: ms(percentile(sorted, 0.5)), P90Ms: ms(percentile(sorted, 0.9)), P99Ms: ms(percentile(sorted, 0.99)),
		P999Ms: ms(percentile(sorted, 0.999)), MaxMs: ms(percentile(sorted, 1)),
	}
}

// cdf samples the distribution of sorted latencies (ns) at 200 evenly
// spaced fractions and more densely in the tail (above 0.99), for the plot.
func cdf(sorted []int64) []cdfPoint {
	if len(sorted) == 0 {
		return nil
	}
	var fracs []float64
	for i := 0; i <= 200; i++ {
		fracs = append(fracs, float64(i)/200)
	}
	fracs = append(fracs, 0.991, 0.992, 0.993, 0.994, 0.995, 0.996, 0.997, 0.998, 0.999, 0.9995, 0.9999)
	slices.Sort(fracs)
	out := make([]cdfPoint, 0, len(fracs))
	for _, f := range fracs {
		out = append(out, cdfPoint{Ms: ms(percentile(sorted, max(f, 1/float64(len(sorted))))), Frac: f})
	}
	return out
}
