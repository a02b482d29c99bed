package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/millrace/watermill-outbox/adaptive"
)

// idleResult is the CPU a system costs while nothing is published: its
// relay running (for (c) the Sequencer and the Forwarder of one group over
// -partitions partitions; for (b) watermill-sql's forwarder subscriber),
// waiting for messages that do not come.
type idleResult struct {
	System  string  `json:"system"`
	Tuning  string  `json:"tuning,omitempty"`
	Seconds float64 `json:"duration_s"`
	// CPU per second of idling, in milliseconds (1,000 is a whole core),
	// of this process (the relay and the in-process Kafka broker, which
	// idles alike for every system) and of the PostgreSQL server.
	ProcessMillisPerSecond  float64 `json:"process_cpu_ms_per_s"`
	PostgresMillisPerSecond float64 `json:"postgres_cpu_ms_per_s"`
	// Statements are what the idle relay ran (pg_stat_statements).
	Statements []statement `json:"top_statements,omitempty"`
}

// total is the CPU of both, in ms per second.
func (r *idleResult) total() float64 { return r.ProcessMillisPerSecond + r.PostgresMillisPerSecond }

func (r *idleResult) label() string {
	if r.Tuning == "" {
		return systemLabel[r.System]
	}
	return systemLabel[r.System] + ", " + r.Tuning
}

// idleSettle is how long a system runs before its idle CPU is measured: its
// start-up (leases, first passes) is not idling.
const idleSettle = 2 * time.Second

// idlePhase measures, for (b), (b') when -systems names it, and (c) with
// adaptive.Default() and LowLatency(), the CPU of the relay with nothing to
// relay for -idle-duration.
func (b *bench) idlePhase(ctx context.Context, res *results) error {
	type run struct {
		name   string
		tuning *adaptive.Tuning
		label  string
	}
	def, low := adaptive.Default(), adaptive.LowLatency()
	runs := []run{{name: sysPeer}}
	if slices.Contains(b.cfg.systems, sysPeerTuned) {
		runs = append(runs, run{name: sysPeerTuned})
	}
	runs = append(runs, run{name: sysOutbox, tuning: &def, label: "adaptive.Default()"},
		run{name: sysOutbox, tuning: &low, label: "adaptive.LowLatency()"})
	for i, r := range runs {
		tuning := low
		if r.tuning != nil {
			tuning = *r.tuning
		}
		schema := fmt.Sprintf("idle_%s_%d", strings.ReplaceAll(r.name, "-", "_"), i)
		topic := fmt.Sprintf("idle-%s-%d", r.name, i)
		ir, err := b.runIdle(ctx, r.name, r.label, schema, topic, tuning)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		res.Idle = append(res.Idle, ir)
	}
	return nil
}

func (b *bench) runIdle(ctx context.Context, name, tuningLabel, schema, topic string, tuning adaptive.Tuning) (*idleResult, error) {
	kb, sys, err := b.freshSystem(ctx, name, schema, topic, b.cfg.partitions, false, tuning)
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	defer sys.stop()
	if err := sys.start(ctx); err != nil {
		return nil, fmt.Errorf("start the relay: %w", err)
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(idleSettle):
	}
	if err := b.beforeRun(ctx); err != nil {
		return nil, err
	}
	c0, t0 := readCPU(b.postmaster), time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(b.cfg.idleDuration):
	}
	c1, secs := readCPU(b.postmaster), time.Since(t0).Seconds()
	r := &idleResult{
		System: name, Tuning: tuningLabel, Seconds: secs,
		ProcessMillisPerSecond:  (c1.process - c0.process).Seconds() * 1e3 / secs,
		PostgresMillisPerSecond: (c1.server - c0.server).Seconds() * 1e3 / secs,
	}
	r.Statements = b.topStatements(ctx)
	logf("idle %s: %.1f ms CPU per second (process %.1f + PostgreSQL %.1f) over %.0f s",
		r.label(), r.total(), r.ProcessMillisPerSecond, r.PostgresMillisPerSecond, secs)
	return r, nil
}

// idleMarkdown renders the idle phase.
func (res *results) idleMarkdown(sb *strings.Builder) {
	if len(res.Idle) == 0 {
		return
	}
	fmt.Fprintf(sb, "## Idle: the relay with nothing to relay\n\n")
	fmt.Fprintf(sb, "%v partitions, one consumer group, nothing published; CPU per second of idling after %v of start-up (1,000 ms/s is a whole core). The process holds the in-process Kafka broker too, which idles alike for every system.\n\n",
		res.Config["partitions"], idleSettle)
	sb.WriteString("| system | seconds | CPU ms/s (process + PostgreSQL) |\n|---|---:|---:|\n")
	for _, r := range res.Idle {
		fmt.Fprintf(sb, "| %s | %.0f | %.1f (%.1f + %.1f) |\n", r.label(), r.Seconds, r.total(), r.ProcessMillisPerSecond, r.PostgresMillisPerSecond)
	}
	sb.WriteString("\n")
}
