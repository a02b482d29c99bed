package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/millrace/watermill-outbox/adaptive"
)

// Modes of the compare runs.
const (
	// modePublish: (a), publishing only.
	modePublish = "publish"
	// modeSteady: the relay runs while the publishers publish.
	modeSteady = "steady"
	// modeBacklog: the publishers publish everything with the relay
	// stopped; then the relay starts and drains the backlog.
	modeBacklog = "backlog"
)

// comparePhase runs each system of -systems for each -per-tx value: (a)
// once, (b) and (c) in steady and in backlog mode.
func (b *bench) comparePhase(ctx context.Context, res *results) error {
	for _, perTx := range b.cfg.perTx {
		for _, name := range b.cfg.systems {
			modes := []string{modeSteady, modeBacklog}
			if name == sysCeiling {
				modes = []string{modePublish}
			}
			for _, mode := range modes {
				r, err := b.runCompare(ctx, name, mode, perTx)
				if err != nil {
					return fmt.Errorf("%s %s, %d/tx: %w", name, mode, perTx, err)
				}
				res.Runs = append(res.Runs, r)
			}
		}
	}
	res.Ratios = ratios(res.Runs, b.cfg.perTx)
	return nil
}

// runCompare sets up system name in a fresh schema with a fresh broker,
// publishes -messages messages in transactions of perTx with -publishers
// goroutines and, for (b) and (c), waits until all of them are at the
// broker, counting the records a read_committed consumer read, every 200
// ms. In steady mode the relay runs from before the first publish; in
// backlog mode it starts after the last commit.
func (b *bench) runCompare(ctx context.Context, name, mode string, perTx int) (*runResult, error) {
	cfg := b.cfg
	schema := fmt.Sprintf("cmp_%s_%s_pt%d", strings.ReplaceAll(name, "-", "_"), mode, perTx)
	topic := fmt.Sprintf("%s-%s-pt%d", name, mode, perTx)
	kb, sys, err := b.freshSystem(ctx, name, schema, topic, cfg.partitions, false, adaptive.Default())
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	defer sys.stop()
	if mode == modeSteady {
		if err := sys.start(ctx); err != nil {
			return nil, fmt.Errorf("start the relay: %w", err)
		}
	}
	pool, err := b.warmPool(ctx, cfg.publishers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := b.beforeRun(ctx); err != nil {
		return nil, err
	}

	txs := (cfg.messages + perTx - 1) / perTx
	r := &runResult{System: name, Mode: mode, PerTx: perTx, Messages: txs * perTx, Publishers: cfg.publishers}
	cr := &compareRun{r: r, sys: sys, kb: kb, label: fmt.Sprintf("%s %s, %d msg/tx", name, mode, perTx)}
	what := map[string]string{
		modePublish: "",
		modeSteady:  ", the relay to Kafka topic " + topic + " running",
		modeBacklog: ", the relay stopped",
	}[mode]
	logf("%s: publishing %d messages in %d transactions with %d publishers%s", cr.label, r.Messages, txs, cfg.publishers, what)

	cr.cpu0 = readCPU(b.postmaster)
	cr.t0 = time.Now()
	cr.relayAt, cr.cpuRelay = cr.t0, cr.cpu0
	cr.load = &load{sys: sys, pool: pool, perTx: perTx, workers: cfg.publishers, t0: cr.t0}
	pubDone := make(chan error, 1)
	go func() { pubDone <- b.publish(ctx, cr.load, unpaced(ctx, txs, nil)) }()
	if err := b.driveCompare(ctx, cr, pubDone); err != nil {
		return nil, err
	}
	if sys.kafkaTopic != "" {
		r.Statements = b.topStatements(ctx)
	}
	return r, nil
}

// compareRun is the state of a compare run while it runs.
type compareRun struct {
	r     *runResult
	sys   *system
	kb    *broker
	load  *load
	label string
	t0    time.Time // the first BEGIN
	cpu0  cpuSample
	// relayAt and cpuRelay: when the relay started (t0 and cpu0 unless
	// in backlog mode).
	relayAt  time.Time
	cpuRelay cpuSample
}

// driveCompare waits for the publishers; in backlog mode it then starts
// the relay. For (b) and (c) it counts the messages at the broker every
// 200 ms until all are there or -max-drain has passed since the last
// COMMIT. It fills in cr.r.
func (b *bench) driveCompare(ctx context.Context, cr *compareRun, pubDone <-chan error) error {
	r := cr.r
	var (
		end       time.Time
		deadline  time.Time
		published bool
		lastLog   = cr.t0
	)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for end.IsZero() {
		select {
		case err := <-pubDone:
			pubDone = nil
			if err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			if err := b.published(ctx, cr); err != nil {
				return err
			}
			if cr.sys.kafkaTopic == "" {
				r.Complete = true
				r.finish(cr.cpu0, readCPU(b.postmaster))
				return nil
			}
			published = true
			deadline = time.Now().Add(b.cfg.maxDrain)
		case <-tick.C:
		}
		if cr.sys.kafkaTopic == "" {
			continue
		}
		n, err := cr.kb.counter.Count(ctx, cr.sys.kafkaTopic)
		if err != nil {
			return fmt.Errorf("count broker offsets: %w", err)
		}
		now := time.Now()
		r.Samples = append(r.Samples, sample{T: now.Sub(cr.t0).Seconds(), Published: cr.load.published.Load(), AtBroker: n})
		r.AtBroker = n
		switch {
		case n >= int64(r.Messages):
			r.Complete = true
			end = now
		case published && now.After(deadline):
			logf("%s: gave up after -max-drain %v with %d of %d at the broker", cr.label, b.cfg.maxDrain, n, r.Messages)
			end = now
		case now.Sub(lastLog) >= 2*time.Second:
			lastLog = now
			logf("%s: %6.1f s  published %d  at broker %d", cr.label, now.Sub(cr.t0).Seconds(), cr.load.published.Load(), n)
		}
	}
	cpuEnd := readCPU(b.postmaster)
	r.finish(cr.cpu0, cpuEnd)
	r.EndToEndSeconds = end.Sub(cr.t0).Seconds()
	r.EndToEndRate = float64(r.AtBroker) / r.EndToEndSeconds
	if r.Mode != modeBacklog {
		logf("%s: %d at the broker %.2f s after the first publish: %.0f msg/s end to end; CPU %.1f s (process %.1f, postgres %.1f), peak RSS %d MiB",
			cr.label, r.AtBroker, r.EndToEndSeconds, r.EndToEndRate, r.CPUSeconds, r.ProcessCPUSeconds, r.PostgresCPUSeconds, r.PeakRSSBytes>>20)
		return nil
	}
	r.DrainSeconds = end.Sub(cr.relayAt).Seconds()
	r.DrainRate = float64(r.AtBroker) / r.DrainSeconds
	r.DrainCPUSeconds = cpuEnd.total() - cr.cpuRelay.total()
	r.DrainCPUMicrosPerMessage = r.DrainCPUSeconds * 1e6 / float64(r.Messages)
	logf("%s: %d at the broker %.2f s after the relay started: drained at %.0f msg/s (CPU %.1f s); %.0f msg/s from the first publish; CPU %.1f s (process %.1f, postgres %.1f), peak RSS %d MiB",
		cr.label, r.AtBroker, r.DrainSeconds, r.DrainRate, r.DrainCPUSeconds, r.EndToEndRate, r.CPUSeconds, r.ProcessCPUSeconds, r.PostgresCPUSeconds, r.PeakRSSBytes>>20)
	return nil
}

// published records the publish figures once the publishers are done and,
// in backlog mode, starts the relay.
func (b *bench) published(ctx context.Context, cr *compareRun) error {
	r := cr.r
	elapsed := time.Duration(cr.load.lastCommit.Load())
	r.PublishSeconds = elapsed.Seconds()
	r.PublishRate = float64(r.Messages) / elapsed.Seconds()
	logf("%s: published %d in %.2f s: %.0f msg/s", cr.label, r.Messages, elapsed.Seconds(), r.PublishRate)
	if r.Mode != modeBacklog {
		return nil
	}
	cr.relayAt, cr.cpuRelay = time.Now(), readCPU(b.postmaster)
	r.RelayStartSeconds = cr.relayAt.Sub(cr.t0).Seconds()
	logf("%s: starting the relay to Kafka topic %s", cr.label, cr.sys.kafkaTopic)
	if err := cr.sys.start(ctx); err != nil {
		return fmt.Errorf("start the relay: %w", err)
	}
	return nil
}

// finish fills in the CPU figures from c0 (start) and c1 (end) and the
// peak RSS.
func (r *runResult) finish(c0, c1 cpuSample) {
	r.ProcessCPUSeconds = (c1.process - c0.process).Seconds()
	r.PostgresCPUSeconds = (c1.server - c0.server).Seconds()
	r.CPUSeconds = r.ProcessCPUSeconds + r.PostgresCPUSeconds
	if r.Messages > 0 {
		r.CPUMicrosPerMessage = r.CPUSeconds * 1e6 / float64(r.Messages)
	}
	r.PeakRSSBytes = peakRSS()
}
