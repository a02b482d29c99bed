package main

import (
	"fmt"
	"slices"
)

// The light-load targets (issue 28): the load most services run, 1,000
// msg/s and less, one message per transaction, with the default profile,
// in both publishing modes.
const (
	lightP50Ms       = 2.0  // p50 commit→broker at 1,000 msg/s
	lightP99Ms       = 10.0 // p99 commit→broker at 1,000 msg/s
	lightCPUAt1000   = 0.8  // CPU per message ÷ the best peer's, at 1,000 msg/s
	lightCPUAt100    = 1.0  // the same at 100 msg/s
	lightPublishWith = 0.8  // publish msg/s with the relay running ÷ plain INSERT's, 1/tx
	lightCPUCeiling  = 1.5  // CPU per message ÷ the plain INSERT's at the same rate, at 1,000 msg/s (issue 40)
)

// peers are the systems the outbox is compared with.
var peers = []string{sysPeer, sysPeerTuned, sysRiver}

// lightLoadTargets checks the light-load targets against what was
// measured: latency and CPU per message with adaptive.Default() against
// the peer with the lowest CPU per message at the same load, an idle
// outbox against an idle watermill-sql subscriber, and publishing at 1
// msg/tx with the relay running against the plain INSERT.
func (res *results) lightLoadTargets() []target {
	var out []target
	for _, load := range []int{1000, 100} {
		best := res.bestPeerLatency(load)
		ceil := res.latencyRun(sysCeiling, load, "")
		for _, sys := range []string{sysOutbox, sysOutboxWAL} {
			l := res.latencyRun(sys, load, "adaptive.Default()")
			if l == nil {
				continue
			}
			name := systemLabel[sys] + ", adaptive.Default()"
			if load == 1000 {
				out = append(out,
					atMost(fmt.Sprintf("p50 commit→broker at 1,000 msg/s, %s (ms)", name), l.Latency.P50Ms, lightP50Ms, l.Complete),
					atMost(fmt.Sprintf("p99 commit→broker at 1,000 msg/s, %s (ms)", name), l.Latency.P99Ms, lightP99Ms, l.Complete))
				if ceil != nil && ceil.Complete && ceil.CPUMicrosPerMessage > 0 {
					out = append(out, atMost(fmt.Sprintf("CPU per message at 1,000 msg/s ÷ the plain INSERT's at that rate (%.0f µs), %s", ceil.CPUMicrosPerMessage, name),
						l.CPUMicrosPerMessage/ceil.CPUMicrosPerMessage, lightCPUCeiling, l.Complete))
				}
			}
			if best == nil || best.CPUMicrosPerMessage == 0 {
				continue
			}
			limit := lightCPUAt1000
			if load == 100 {
				limit = lightCPUAt100
			}
			out = append(out, atMost(fmt.Sprintf("CPU per message at %d msg/s ÷ best peer's (%s, %.0f µs), %s", load, best.System, best.CPUMicrosPerMessage, name),
				l.CPUMicrosPerMessage/best.CPUMicrosPerMessage, limit, l.Complete))
		}
	}
	var peerIdle, outboxIdle *idleResult
	for _, r := range res.Idle {
		switch {
		case r.System == sysPeer:
			peerIdle = r
		case r.System == sysOutbox && r.Tuning == "adaptive.Default()":
			outboxIdle = r
		}
	}
	if peerIdle != nil && outboxIdle != nil && peerIdle.total() > 0 {
		t := atMost("idle CPU, (c) adaptive.Default() ÷ (b) watermill-sql subscriber", outboxIdle.total()/peerIdle.total(), 1, true)
		t.Goal, t.Met = "< 1×", t.Measured < 1
		out = append(out, t)
	}
	if a := find(res.Runs, sysCeiling, modePublish, 1); a != nil && a.PublishRate > 0 {
		for _, sys := range []string{sysOutbox, sysOutboxWAL} {
			if r := find(res.Runs, sys, modeSteady, 1); r != nil {
				out = append(out, atLeast(fmt.Sprintf("publish msg/s with the relay running ÷ plain INSERT's, 1/tx, %s", systemLabel[sys]),
					r.PublishRate/a.PublishRate, lightPublishWith, r.Complete))
			}
		}
	}
	return out
}

// bestPeerLatency is the complete latency run of a peer at load with the
// lowest CPU per message, or nil.
func (res *results) bestPeerLatency(load int) *latencyResult {
	var best *latencyResult
	for _, l := range res.Latency {
		if l.OfferedRate != load || !l.Complete || !slices.Contains(peers, l.System) {
			continue
		}
		if best == nil || l.CPUMicrosPerMessage < best.CPUMicrosPerMessage {
			best = l
		}
	}
	return best
}

// latencyRun is system's latency run at load with tuning, or nil.
func (res *results) latencyRun(system string, load int, tuning string) *latencyResult {
	for _, l := range res.Latency {
		if l.System == system && l.OfferedRate == load && l.Tuning == tuning {
			return l
		}
	}
	return nil
}

// atMost is a target met when measured is at most limit (and the run
// complete).
func atMost(name string, measured, limit float64, complete bool) target {
	return target{Name: name, Measured: measured, Goal: fmt.Sprintf("≤ %g", limit), Met: complete && measured <= limit, Limit: limit, AtMost: true}
}

// atLeast is a target met when measured is at least limit (and the run
// complete).
func atLeast(name string, measured, limit float64, complete bool) target {
	return target{Name: name, Measured: measured, Goal: fmt.Sprintf("≥ %g", limit), Met: complete && measured >= limit, Limit: limit}
}
