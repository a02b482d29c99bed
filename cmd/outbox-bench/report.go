package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"os"
	"path/filepath"
	"strings"
)

// results is everything a run of the command measured; results.json is
// this, results.md its tables.
type results struct {
	Started string         `json:"started"`
	Seconds float64        `json:"seconds"`
	Machine machineInfo    `json:"machine"`
	Config  map[string]any `json:"config"`
	// PGStatStatements: pg_stat_statements was available, and each run of
	// (b) and (c) has its top statements.
	PGStatStatements bool               `json:"pg_stat_statements"`
	PublishRounds    []*publishRound    `json:"publish_rounds,omitempty"`
	PublishSummary   []publishSummary   `json:"publish_summary,omitempty"`
	Runs             []*runResult       `json:"compare_runs"`
	Ratios           []ratio            `json:"compare_ratios"`
	Latency          []*latencyResult   `json:"latency"`
	Growth           *growthResult      `json:"growth,omitempty"`
	Isolation        []*isolationResult `json:"isolation,omitempty"`
	Idle             []*idleResult      `json:"idle,omitempty"`
	Soak             *soakResult        `json:"soak,omitempty"`
	Sources          *sourcesResult     `json:"sources,omitempty"`
	Targets          []target           `json:"targets"`
}

// runResult is one compare run: one system, one mode, one -per-tx value.
type runResult struct {
	System     string `json:"system"`
	Mode       string `json:"mode"`
	PerTx      int    `json:"per_tx"`
	Messages   int    `json:"messages"`
	Publishers int    `json:"publishers"`
	// Complete is false when not every message reached the broker within
	// -max-drain (the end-to-end rate then counts those that did).
	Complete       bool    `json:"complete"`
	PublishSeconds float64 `json:"publish_seconds"`
	PublishRate    float64 `json:"publish_msgs_per_s"`
	AtBroker       int64   `json:"at_broker,omitempty"`
	// EndToEnd*: from the first BEGIN until the last message was at the
	// broker (both modes).
	EndToEndSeconds float64 `json:"end_to_end_seconds,omitempty"`
	EndToEndRate    float64 `json:"end_to_end_msgs_per_s,omitempty"`
	// Backlog mode: the relay started RelayStartSeconds after the first
	// BEGIN (after the last COMMIT); Drain* from then until the last
	// message was at the broker.
	RelayStartSeconds        float64 `json:"relay_start_seconds,omitempty"`
	DrainSeconds             float64 `json:"drain_seconds,omitempty"`
	DrainRate                float64 `json:"drain_msgs_per_s,omitempty"`
	DrainCPUSeconds          float64 `json:"drain_cpu_s,omitempty"`
	DrainCPUMicrosPerMessage float64 `json:"drain_cpu_us_per_msg,omitempty"`
	// CPU over the whole run (until the last message reached the broker):
	// this process (publishers, relay, in-process Kafka broker) and the
	// PostgreSQL server processes.
	ProcessCPUSeconds   float64     `json:"process_cpu_s"`
	PostgresCPUSeconds  float64     `json:"postgres_cpu_s"`
	CPUSeconds          float64     `json:"cpu_s"`
	CPUMicrosPerMessage float64     `json:"cpu_us_per_msg"`
	PeakRSSBytes        int64       `json:"peak_rss_bytes"`
	Samples             []sample    `json:"samples,omitempty"`
	Statements          []statement `json:"top_statements,omitempty"`
}

// sample is the state of a run at T seconds after its first publish.
type sample struct {
	T         float64 `json:"t"`
	Published int64   `json:"published"`
	AtBroker  int64   `json:"at_broker"`
}

// ratio compares (c) with (a) or (b) at one -per-tx value.
type ratio struct {
	PerTx int    `json:"per_tx"`
	Name  string `json:"name"`
	// Basis says which runs are compared.
	Basis string `json:"basis"`
	// Publish compares publish msg/s; EndToEnd end-to-end msg/s (steady)
	// or drain msg/s (backlog); CPU the CPU time per message over the
	// whole runs (other/this: above 1 means (c) needs less CPU per
	// message).
	Publish  float64 `json:"publish"`
	EndToEnd float64 `json:"end_to_end,omitempty"`
	CPU      float64 `json:"cpu_per_msg"`
}

// target is one of issue 6's targets and whether this run met it.
type target struct {
	Name     string  `json:"name"`
	Measured float64 `json:"measured"`
	Goal     string  `json:"goal"`
	Met      bool    `json:"met"`
	// Limit and AtMost, when Limit is set, say how to judge a median of
	// several runs' Measured (-medians): met when at most (AtMost) or at
	// least Limit.
	Limit  float64 `json:"limit,omitempty"`
	AtMost bool    `json:"at_most,omitempty"`
}

func jsonConfig(c config) map[string]any {
	return map[string]any{
		"phases": c.phases, "systems": c.systems,
		"messages": c.messages, "payload": c.payload, "keys": c.keys, "partitions": c.partitions,
		"per_tx": c.perTx, "publishers": c.publishers, "max_drain": c.maxDrain.String(), "smoke": c.smoke,
		"outbox_notify":    c.outboxNotify,
		"forward_only":     c.forwardOnly,
		"relay_pace":       c.relayPace.String(),
		"latency_loads":    c.latencyLoads,
		"latency_duration": c.latencyDuration.String(), "latency_publishers": c.latencyPublishers,
		"growth_history": c.growthHistory, "growth_max_backlog": c.growthMaxBacklog, "growth_rate": c.growthRate, "publish_rounds": c.publishRounds,
		"growth_partitions": c.growthPartitions, "growth_messages": c.growthMessages, "isolation_rate": c.isolationRate,
		"soak_duration": c.soakDuration.String(), "soak_rate": c.soakRate, "soak_interval": c.soakInterval.String(),
		"soak_keep_for": c.soakKeepFor.String(), "soak_naptime": c.soakNaptime.String(), "soak_table_defaults": c.soakTableDefaults,
	}
}

func find(runs []*runResult, sys, mode string, perTx int) *runResult {
	for _, r := range runs {
		if r.System == sys && r.Mode == mode && r.PerTx == perTx {
			return r
		}
	}
	return nil
}

func endToEnd(r *runResult) float64 { return r.EndToEndRate }
func drain(r *runResult) float64    { return r.DrainRate }

// faster returns the run of x and y with the higher rate (nil when both
// are nil).
func faster(x, y *runResult, rate func(*runResult) float64) *runResult {
	switch {
	case x == nil:
		return y
	case y == nil:
		return x
	case rate(y) > rate(x):
		return y
	}
	return x
}

func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

const (
	ratioCA = "(c)/(a) outbox / plain INSERT"
	ratioCB = "(c)/(b) outbox / watermill-sql + forwarder"
	ratioEO = "(c)/(c') exactly once / at least once"
	ratioCD = "(c)/(d) outbox / River as an outbox"
	ratioCP = "(c)/best peer: outbox / the fastest of (b), (b') and (d)"
	// ratioCeiling: end to end (steady) or drain (backlog) ÷ the ceiling's
	// publish rate, for (c) and (e).
	ratioCeiling = "end to end ÷ plain-INSERT publish (the ceiling)"
	ratioEC      = "(e)/(c) log-based / table mode"
)

// ratios compares, per -per-tx value, (c) with (a) by publish rate (with
// the publishers alone, from (c)'s backlog run, and with the relay
// running, from its steady run) and (c) with (b) in both modes.
func ratios(runs []*runResult, perTxs []int) []ratio {
	var out []ratio
	for _, n := range perTxs {
		a := find(runs, sysCeiling, modePublish, n)
		bS, bB := find(runs, sysPeer, modeSteady, n), find(runs, sysPeer, modeBacklog, n)
		cS, cB := find(runs, sysOutbox, modeSteady, n), find(runs, sysOutbox, modeBacklog, n)
		if a != nil && cB != nil {
			out = append(out, ratio{PerTx: n, Name: ratioCA, Basis: "publishers alone (backlog run)",
				Publish: div(cB.PublishRate, a.PublishRate), CPU: div(a.CPUMicrosPerMessage, cB.CPUMicrosPerMessage)})
		}
		if a != nil && cS != nil {
			out = append(out, ratio{PerTx: n, Name: ratioCA, Basis: "relay running (steady run)",
				Publish: div(cS.PublishRate, a.PublishRate), CPU: div(a.CPUMicrosPerMessage, cS.CPUMicrosPerMessage)})
		}
		// versus appends (c) ÷ other in both modes: steady (end to end) and
		// backlog (drain); basis is said after the mode.
		versus := func(name string, steady, backlog *runResult, basis string) {
			if steady != nil && cS != nil {
				out = append(out, ratio{PerTx: n, Name: name, Basis: "steady: end to end" + basis,
					Publish: div(cS.PublishRate, steady.PublishRate), EndToEnd: div(cS.EndToEndRate, steady.EndToEndRate),
					CPU: div(steady.CPUMicrosPerMessage, cS.CPUMicrosPerMessage)})
			}
			if backlog != nil && cB != nil {
				out = append(out, ratio{PerTx: n, Name: name, Basis: "backlog: drain" + basis,
					Publish: div(cB.PublishRate, backlog.PublishRate), EndToEnd: div(cB.DrainRate, backlog.DrainRate),
					CPU: div(backlog.CPUMicrosPerMessage, cB.CPUMicrosPerMessage)})
			}
		}
		versus(ratioCB, bS, bB, "")
		dS, dB := find(runs, sysRiver, modeSteady, n), find(runs, sysRiver, modeBacklog, n)
		versus(ratioCD, dS, dB, "")
		tS, tB := find(runs, sysPeerTuned, modeSteady, n), find(runs, sysPeerTuned, modeBacklog, n)
		if best := faster(faster(bS, tS, endToEnd), dS, endToEnd); best != nil {
			versus(ratioCP, best, nil, ", best peer "+best.System)
		}
		if best := faster(faster(bB, tB, drain), dB, drain); best != nil {
			versus(ratioCP, nil, best, ", best peer "+best.System)
		}
		versus(ratioEO, find(runs, sysOutboxALO, modeSteady, n), find(runs, sysOutboxALO, modeBacklog, n), "")
		eS, eB := find(runs, sysOutboxWAL, modeSteady, n), find(runs, sysOutboxWAL, modeBacklog, n)
		if a != nil {
			for _, x := range []*runResult{cS, eS} {
				if x != nil {
					out = append(out, ratio{PerTx: n, Name: ratioCeiling, Basis: systemLabel[x.System] + ", steady",
						Publish: div(x.PublishRate, a.PublishRate), EndToEnd: div(x.EndToEndRate, a.PublishRate)})
				}
			}
			if eB != nil {
				out = append(out, ratio{PerTx: n, Name: ratioCA, Basis: "(e) publishers alone (backlog run)",
					Publish: div(eB.PublishRate, a.PublishRate), CPU: div(a.CPUMicrosPerMessage, eB.CPUMicrosPerMessage)})
			}
		}
		if eS != nil && cS != nil {
			out = append(out, ratio{PerTx: n, Name: ratioEC, Basis: "steady: end to end", Publish: div(eS.PublishRate, cS.PublishRate),
				EndToEnd: div(eS.EndToEndRate, cS.EndToEndRate), CPU: div(cS.CPUMicrosPerMessage, eS.CPUMicrosPerMessage)})
		}
		if eB != nil && cB != nil {
			out = append(out, ratio{PerTx: n, Name: ratioEC, Basis: "backlog: drain", Publish: div(eB.PublishRate, cB.PublishRate),
				EndToEnd: div(eB.DrainRate, cB.DrainRate), CPU: div(cB.CPUMicrosPerMessage, eB.CPUMicrosPerMessage)})
		}
	}
	return out
}

// targets checks issue 6's targets against what was measured.
func (res *results) targets() []target {
	out := []target{}
	for _, q := range res.Ratios {
		if q.Name == ratioCB && q.EndToEnd != 0 {
			out = append(out, target{Name: fmt.Sprintf("(c)/(b) %s, %d/tx", q.Basis, q.PerTx), Measured: q.EndToEnd, Goal: "≥ 15×", Met: q.EndToEnd >= 15})
		}
		if q.Name == ratioCP && q.EndToEnd != 0 {
			goal, min := "≥ 5×", 5.0
			if q.PerTx == 1 {
				goal, min = "> 1× (ahead of every peer)", 1.0
			}
			out = append(out, target{Name: fmt.Sprintf("(c)/best peer %s, %d/tx", q.Basis, q.PerTx), Measured: q.EndToEnd, Goal: goal, Met: q.EndToEnd >= min && (q.PerTx != 1 || q.EndToEnd > 1)})
		}
		if q.Name == ratioCeiling && q.PerTx == 100 && q.EndToEnd != 0 {
			goal, min := "≥ 0.5× (issue 16)", 0.5
			if strings.HasPrefix(q.Basis, "(e)") {
				goal, min = "≥ 0.8× (issue 17)", 0.8
			}
			out = append(out, target{Name: "end to end ÷ ceiling publish, " + q.Basis + ", 100/tx", Measured: q.EndToEnd, Goal: goal, Met: q.EndToEnd >= min})
		}
		if q.Name == ratioEO && q.PerTx == 100 && q.EndToEnd != 0 {
			out = append(out, target{Name: fmt.Sprintf("(c)/(c') exactly once / at least once, %s, 100/tx", q.Basis), Measured: q.EndToEnd, Goal: "≥ 0.9×", Met: q.EndToEnd >= 0.9})
		}
	}
	for _, s := range res.PublishSummary {
		if s.System == sysOutbox && s.PerTx == 100 && s.RatioToA != 0 {
			out = append(out, target{Name: fmt.Sprintf("(c)/(a) publish, 100/tx, publishers alone, median of %d interleaved rounds", s.Rounds), Measured: s.RatioToA, Goal: "≥ 0.8×", Met: s.RatioToA >= 0.8})
		}
		if s.System == sysOutboxWAL && s.PerTx == 100 && s.RatioToA != 0 {
			out = append(out, target{Name: fmt.Sprintf("(e)/(a) publish, 100/tx, publishers alone, median of %d interleaved rounds", s.Rounds), Measured: s.RatioToA, Goal: "≥ 1.0× (issue 17)", Met: s.RatioToA >= 1.0})
		}
	}
	for _, q := range res.Ratios {
		if q.Name == ratioCA && q.PerTx == 100 && q.Basis == "publishers alone (backlog run)" {
			out = append(out, target{Name: "(c)/(a) publish, 100/tx, publishers alone, one backlog run", Measured: q.Publish, Goal: "≥ 0.8×", Met: q.Publish >= 0.8})
		}
	}
	for _, l := range res.Latency {
		if l.System == sysOutbox && l.OfferedRate == 1000 && l.Tuning == "adaptive.LowLatency()" {
			out = append(out, target{Name: "(c) p99 commit→broker at 1,000 msg/s, adaptive.LowLatency()", Measured: l.Latency.P99Ms, Goal: "≤ 25 ms",
				Met: l.Complete && l.Latency.P99Ms <= 25})
		}
		if l.System == sysOutboxWAL && l.OfferedRate == 1000 && l.Tuning == "adaptive.LowLatency()" {
			out = append(out, target{Name: "(e) p50 commit→broker at 1,000 msg/s, adaptive.LowLatency()", Measured: l.Latency.P50Ms, Goal: "≤ 2 ms (issue 17)", Met: l.Complete && l.Latency.P50Ms <= 2},
				target{Name: "(e) p99 commit→broker at 1,000 msg/s, adaptive.LowLatency()", Measured: l.Latency.P99Ms, Goal: "≤ 10 ms (issue 17)", Met: l.Complete && l.Latency.P99Ms <= 10})
		}
	}
	out = append(out, res.lightLoadTargets()...)
	if base, on := res.isolationRun(isoNoFailures), res.isolationRun(isoOn); base != nil && on != nil && base.OthersWindowRate > 0 {
		q := on.OthersWindowRate / base.OthersWindowRate
		out = append(out, target{Name: "key isolation on: the other keys' throughput during the failures / with no failures", Measured: q, Goal: "≥ 0.9×",
			Met: q >= 0.9 && on.OrderKept})
	}
	return out
}

// incomplete reports the runs that did not get every message to the
// broker.
func (res *results) incomplete() error {
	var errs []error
	for _, r := range res.Runs {
		if !r.Complete && r.System != sysCeiling {
			errs = append(errs, fmt.Errorf("compare %s %s, %d/tx: only %d of %d messages reached the broker within -max-drain", r.System, r.Mode, r.PerTx, r.AtBroker, r.Messages))
		}
	}
	for _, l := range res.Latency {
		if !l.Complete {
			errs = append(errs, fmt.Errorf("latency %s at %d msg/s: only %d of %d messages reached the consumer within -max-drain", l.System, l.OfferedRate, l.Received, l.Messages))
		}
	}
	for _, r := range res.Isolation {
		if !r.Complete {
			errs = append(errs, fmt.Errorf("isolation, %s: not every message was handled within -max-drain", r.Run))
		}
	}
	if g := res.Growth; g != nil {
		runs := g.Partitions
		if g.History != nil {
			runs = append([]*growthRun{&g.History.growthRun}, runs...)
		}
		if g.HistoryPaced != nil {
			runs = append([]*growthRun{&g.HistoryPaced.growthRun}, runs...)
		}
		for _, r := range runs {
			if r.Messages > 0 && !r.Complete {
				errs = append(errs, fmt.Errorf("growth, %d partitions: only %d of %d messages reached the consumer within -max-drain", r.Partitions, r.Delivered, r.Messages))
			}
		}
	}
	return errors.Join(errs...)
}

// write writes every output file into dir.
func (res *results) write(dir string) error {
	res.Targets = res.targets()
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
	}{
		{"results.json", append(b, '\n')},
		{"results.md", []byte(res.markdown())},
		{"statements.md", []byte(res.statementsMarkdown())},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
			return err
		}
	}
	var errs []error
	for _, png := range []struct {
		name string
		draw func() (image.Image, error)
	}{
		{"throughput.png", func() (image.Image, error) { return throughputImage(res.Runs) }},
		{"latency.png", func() (image.Image, error) { return latencyImage(res.Latency) }},
		{"growth.png", func() (image.Image, error) { return growthImage(res.Growth) }},
		{"soak.png", func() (image.Image, error) { return soakImage(res.Soak) }},
	} {
		if png.name == "soak.png" && res.Soak == nil {
			continue
		}
		img, err := png.draw()
		errs = append(errs, writePNG(filepath.Join(dir, png.name), img, err))
	}
	return errors.Join(errs...)
}

var systemLabel = map[string]string{
	sysCeiling: "(a) plain INSERT (ceiling)",
	sysPeer:    "(b) watermill-sql + forwarder → Kafka",
	sysOutbox:  "(c) watermill-outbox → Kafka",
	// One label for one system: (c) is exactly once by default.
	sysOutboxALO: "(c') watermill-outbox → Kafka, at least once",
	sysRiver:     "(d) River as an outbox → Kafka (no order per key)",
	sysPeerTuned: "(b') watermill-sql tuned + forwarder → Kafka",
	sysOutboxWAL: "(e) watermill-outbox log-based (WAL) → Kafka",
}

// markdown renders every table.
func (res *results) markdown() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Machine: %s; %s.\n\n", res.Machine.String(), res.Machine.PostgreSQL)
	if res.Config["forward_only"] == true {
		sb.WriteString("**(c), (e) and the sources phase ran with their topic registered `outbox.ForwardOnly()`** (`-outbox-forward-only`): their messages go from `pending` to Kafka without the log.\n\n")
	}
	if len(res.PublishSummary) > 0 {
		res.publishRoundsMarkdown(&sb)
	}
	if len(res.Runs) > 0 {
		res.compareMarkdown(&sb)
	}
	if len(res.Latency) > 0 {
		res.latencyMarkdown(&sb)
	}
	if res.Growth != nil {
		res.growthMarkdown(&sb)
	}
	res.isolationMarkdown(&sb)
	res.idleMarkdown(&sb)
	res.soakMarkdown(&sb)
	res.sourcesMarkdown(&sb)
	if len(res.Targets) > 0 {
		sb.WriteString("## Targets\n\n")
		if res.Config["smoke"] == true {
			sb.WriteString("-smoke: tiny sizes, which check that everything runs and writes its outputs; they say little about speed.\n\n")
		}
		sb.WriteString("| target | measured | goal | met |\n|---|---:|---|---|\n")
		for _, t := range res.Targets {
			fmt.Fprintf(&sb, "| %s | %.2f | %s | %s |\n", t.Name, t.Measured, t.Goal, yesNo(t.Met))
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

func (res *results) compareMarkdown(sb *strings.Builder) {
	fmt.Fprintf(sb, "## Compare\n\n%v messages per system and run, %v-byte payloads, %v keys, %v partitions, %v publishers.\n\n",
		res.Config["messages"], res.Config["payload"], res.Config["keys"], res.Config["partitions"], res.Config["publishers"])
	sb.WriteString("### Steady: the relay runs while publishing\n\n")
	sb.WriteString("| system | msg/tx | publish msg/s | end-to-end msg/s | end-to-end s | CPU s (process + postgres) | CPU µs/msg | peak RSS MiB |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range res.Runs {
		if r.Mode == modeBacklog {
			continue
		}
		e2e, e2es := "—", "—"
		if r.System != sysCeiling {
			e2e, e2es = fmt.Sprintf("%.0f", r.EndToEndRate), fmt.Sprintf("%.2f", r.EndToEndSeconds)
			if !r.Complete {
				e2e += fmt.Sprintf(" (incomplete: %d of %d)", r.AtBroker, r.Messages)
			}
		}
		fmt.Fprintf(sb, "| %s | %d | %.0f | %s | %s | %.1f (%.1f + %.1f) | %.1f | %d |\n",
			systemLabel[r.System], r.PerTx, r.PublishRate, e2e, e2es, r.CPUSeconds, r.ProcessCPUSeconds, r.PostgresCPUSeconds,
			r.CPUMicrosPerMessage, r.PeakRSSBytes>>20)
	}
	sb.WriteString("\n### Backlog: publish with the relay stopped, then start it and drain\n\n")
	sb.WriteString("Publish msg/s is the publishers alone; drain msg/s is messages ÷ (relay start → last message at the broker), including the relay's start-up. (a) is repeated for reference.\n\n")
	sb.WriteString("| system | msg/tx | publish msg/s | drain msg/s | drain s | end-to-end msg/s | CPU s whole run | CPU µs/msg whole run | CPU µs/msg drain | peak RSS MiB |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range res.Runs {
		switch r.Mode {
		case modePublish:
			fmt.Fprintf(sb, "| %s | %d | %.0f | — | — | — | %.1f | %.1f | — | %d |\n",
				systemLabel[r.System], r.PerTx, r.PublishRate, r.CPUSeconds, r.CPUMicrosPerMessage, r.PeakRSSBytes>>20)
		case modeBacklog:
			drain := fmt.Sprintf("%.0f", r.DrainRate)
			if !r.Complete {
				drain += fmt.Sprintf(" (incomplete: %d of %d)", r.AtBroker, r.Messages)
			}
			fmt.Fprintf(sb, "| %s | %d | %.0f | %s | %.2f | %.0f | %.1f | %.1f | %.1f | %d |\n",
				systemLabel[r.System], r.PerTx, r.PublishRate, drain, r.DrainSeconds, r.EndToEndRate, r.CPUSeconds,
				r.CPUMicrosPerMessage, r.DrainCPUMicrosPerMessage, r.PeakRSSBytes>>20)
		}
	}
	if len(res.Ratios) > 0 {
		sb.WriteString("\n### Ratios\n\nCPU per message is inverted (other ÷ (c)): above 1 means (c) needs less CPU per message. End to end is the steady runs' end-to-end rate or the backlog runs' drain rate.\n\n")
		sb.WriteString("| msg/tx | ratio | basis | publish msg/s | end-to-end / drain msg/s | CPU per message (inverse) |\n|---:|---|---|---:|---:|---:|\n")
		for _, q := range res.Ratios {
			e2e := "—"
			if q.EndToEnd != 0 {
				e2e = fmt.Sprintf("**%.2f×**", q.EndToEnd)
			}
			fmt.Fprintf(sb, "| %d | %s | %s | %.2f× | %s | %.2f× |\n", q.PerTx, q.Name, q.Basis, q.Publish, e2e, q.CPU)
		}
	}
	sb.WriteString("\n")
}

func (res *results) latencyMarkdown(sb *strings.Builder) {
	fmt.Fprintf(sb, "## Latency: commit→broker at a fixed offered load\n\n")
	fmt.Fprintf(sb, "Open loop, %v per load, %v publishers, %v partitions; max(1, load/1000) messages per transaction. Latency: from COMMIT returning to the record arriving at a franz-go consumer of the Kafka topic. (c) runs with adaptive.LowLatency(); target: p99 ≤ 25 ms for (c) at 1,000 msg/s.\n\n",
		res.Config["latency_duration"], res.Config["latency_publishers"], res.Config["partitions"])
	sb.WriteString("| system | offered msg/s | msg/tx | achieved msg/s | received | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | p99 ≤ 25 ms | drain after last commit s | CPU µs/msg (process + PostgreSQL) |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n")
	for _, l := range res.Latency {
		achieved := fmt.Sprintf("%.0f", l.AchievedRate)
		if !l.KeptSchedule {
			achieved += fmt.Sprintf(" (behind schedule: lag p99 %.0f ms)", l.LagP99Ms)
		}
		received := fmt.Sprintf("%d", l.Received)
		if !l.Complete {
			received = fmt.Sprintf("%d of %d (incomplete)", l.Received, l.Messages)
		}
		label := l.label()
		if l.System == sysCeiling { // publish only: nothing is delivered
			fmt.Fprintf(sb, "| %s | %d | %d | %s | %s committed | — | — | — | — | — | — | — | %s |\n",
				label, l.OfferedRate, l.PerTx, achieved, received, cpuSplit(l.CPUMicrosPerMessage, l.ProcessMicrosPerMessage, l.PostgresMicrosPerMessage))
			continue
		}
		fmt.Fprintf(sb, "| %s | %d | %d | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %.2f | %s |\n",
			label, l.OfferedRate, l.PerTx, achieved, received, l.Latency.P50Ms, l.Latency.P90Ms, l.Latency.P99Ms,
			l.Latency.P999Ms, l.Latency.MaxMs, yesNo(l.Complete && l.Latency.P99Ms <= 25), l.DrainSeconds, cpuSplit(l.CPUMicrosPerMessage, l.ProcessMicrosPerMessage, l.PostgresMicrosPerMessage))
	}
	sb.WriteString("\n")
}

func (res *results) growthMarkdown(sb *strings.Builder) {
	g := res.Growth
	for _, h := range []*historyResult{g.History, g.HistoryPaced} {
		if h == nil {
			continue
		}
		load := "unpaced"
		switch {
		case h.OfferedRate > 0:
			load = fmt.Sprintf("paced: a fixed offered load of %d msg/s", h.OfferedRate)
		case h.MaxBacklog > 0:
			load = fmt.Sprintf("held to at most %d undelivered", h.MaxBacklog)
		}
		fmt.Fprintf(sb, "## Growth: history (retention on), %s\n\n(c), %d messages into %d partitions, %d publishers (%s), %d/tx, default tuning, retention Vacuum every %v; the consumer deletes what it consumed from the broker every second. A point every 10%% delivered; window figures cover the messages delivered since the previous point.\n\n",
			load, h.Messages, h.Partitions, h.Publishers, load, h.PerTx, vacuumInterval)
		sb.WriteString("| delivered | s | window msg/s | window p50 ms | window p99 ms | backlog | RSS MiB | Go heap MiB | log rows | log MiB | pending rows | pending MiB | vacuumed |\n")
		sb.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, p := range h.Points {
			fmt.Fprintf(sb, "| %d | %.1f | %.0f | %.1f | %.1f | %d | %d | %d | %d | %.1f | %d | %.1f | %d |\n",
				p.Delivered, p.Seconds, p.WindowRate, p.WindowP50Ms, p.WindowP99Ms, p.Backlog, p.RSSBytes>>20, p.HeapInuseBytes>>20,
				p.LogRows, mib(p.LogBytes), p.PendingRows, mib(p.PendingBytes), p.VacuumDeleted)
		}
		fmt.Fprintf(sb, "\nWhole run: %d of %d delivered in %.1f s, %.0f msg/s end to end (publish %.0f msg/s); latency p50 %.1f ms, p99 %.1f ms; CPU %.1f µs/msg; peak RSS %d MiB.\n\n",
			h.Delivered, h.Messages, h.Seconds, h.EndToEndRate, h.PublishRate, h.Latency.P50Ms, h.Latency.P99Ms, h.CPUMicrosPerMessage, h.PeakRSSBytes>>20)
	}
	if len(g.Partitions) > 0 {
		fmt.Fprintf(sb, "## Growth: partitions\n\n(c), %v messages per partition count (as many Kafka partitions), %d publishers, %d/tx, default tuning, unpaced.\n\n", res.Config["growth_messages"], growthPublishers, growthPerTx)
		sb.WriteString("| partitions | messages | publish msg/s | end-to-end msg/s | p50 ms | p99 ms | CPU µs/msg | peak RSS MiB |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range g.Partitions {
			e2e := fmt.Sprintf("%.0f", r.EndToEndRate)
			if !r.Complete {
				e2e += fmt.Sprintf(" (incomplete: %d of %d)", r.Delivered, r.Messages)
			}
			fmt.Fprintf(sb, "| %d | %d | %.0f | %s | %.1f | %.1f | %.1f | %d |\n",
				r.Partitions, r.Messages, r.PublishRate, e2e, r.Latency.P50Ms, r.Latency.P99Ms, r.CPUMicrosPerMessage, r.PeakRSSBytes>>20)
		}
		sb.WriteString("\n")
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// statementsMarkdown renders statements.md: the top statements of each
// run of (b) and (c).
func (res *results) statementsMarkdown() string {
	var sb strings.Builder
	sb.WriteString("# pg_stat_statements: top statements per run\n\n")
	if !res.PGStatStatements {
		sb.WriteString("pg_stat_statements was not available in this run (see the warnings in its output).\n")
		return sb.String()
	}
	fmt.Fprintf(&sb, "The %d statements with the largest total execution time in each run of (b) and (c), from a `pg_stat_statements_reset()` just before the run. `pg_stat_statements.track = all`: statements inside functions and CTEs count on their own, and also in the time of the statement that ran them. Query texts are normalised, on one line, cut at 160 characters.\n\n", topStatementsN)
	table := func(title string, st []statement) {
		if len(st) == 0 {
			return
		}
		fmt.Fprintf(&sb, "## %s\n\n| calls | total ms | mean ms | rows | query |\n|---:|---:|---:|---:|---|\n", title)
		for _, s := range st {
			fmt.Fprintf(&sb, "| %d | %.1f | %.3f | %d | `%s` |\n", s.Calls, s.TotalMs, s.MeanMs, s.Rows, strings.ReplaceAll(s.Query, "|", "\\|"))
		}
		sb.WriteString("\n")
	}
	for _, r := range res.Runs {
		table(fmt.Sprintf("compare %s, %s, %d/tx", systemLabel[r.System], r.Mode, r.PerTx), r.Statements)
	}
	for _, l := range res.Latency {
		table(fmt.Sprintf("latency %s at %d msg/s", l.label(), l.OfferedRate), l.Statements)
	}
	if g := res.Growth; g != nil {
		if g.History != nil {
			table(fmt.Sprintf("growth history, %d messages", g.History.Messages), g.History.Statements)
		}
		if g.HistoryPaced != nil {
			table(fmt.Sprintf("growth history at %d msg/s, %d messages", g.HistoryPaced.OfferedRate, g.HistoryPaced.Messages), g.HistoryPaced.Statements)
		}
		for _, r := range g.Partitions {
			table(fmt.Sprintf("growth, %d partitions", r.Partitions), r.Statements)
		}
	}
	if s := res.Soak; s != nil && s.Run != nil {
		table(fmt.Sprintf("soak at %d msg/s for %s (the whole run; results.md has the top statements' mean per sample)", s.Rate, fmtSeconds(s.DurationSeconds)), s.Run.Statements)
	}
	return sb.String()
}

// label names the system of a latency run, with the relay's tuning when
// the system was run with more than one.
func (r *latencyResult) label() string {
	if r.Tuning == "" {
		return systemLabel[r.System]
	}
	return systemLabel[r.System] + ", " + r.Tuning
}

// cpuSplit renders a CPU figure with its split between this process and
// PostgreSQL ("1420.8 (610.2 + 810.6)"), or alone when the results predate
// the split.
func cpuSplit(total, process, postgres float64) string {
	if process == 0 && postgres == 0 {
		return fmt.Sprintf("%.1f", total)
	}
	return fmt.Sprintf("%.1f (%.1f + %.1f)", total, process, postgres)
}
