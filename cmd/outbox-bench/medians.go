package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// runSpecific matches the parts of a target's name that differ from run to
// run: which peer was the best, and its figure; the ceiling's figure.
var runSpecific = regexp.MustCompile(`best peer (?:peer-tuned|peer|river)\b|best peer's \([^)]*\)|at that rate \([^)]*\)`)

// stableName is a target's name without what differs from run to run, so
// that the same target of several runs is one row.
func stableName(name string) string {
	return runSpecific.ReplaceAllStringFunc(name, func(m string) string {
		if strings.HasPrefix(m, "best peer's") {
			return "best peer's"
		}
		if strings.HasPrefix(m, "at that rate") {
			return "at that rate"
		}
		return "best peer"
	})
}

// medians writes out/medians.md: every target of the runs in dirs (each
// a -out directory with its results.json), with each run's measured
// value, the median, and whether the median meets the goal. The best peer
// may differ from run to run; each run's target is against its own. A target
// without a Limit is met by the median when most runs met it.
func medians(dirs []string, out string) error {
	if len(dirs) == 0 {
		return fmt.Errorf("-medians: no directories")
	}
	type row struct {
		goal     string
		values   []float64
		met      int
		limit    float64
		atMost   bool
		hasLimit bool
	}
	var (
		order   []string
		rows    = map[string]*row{}
		runs    []string
		figures figureTable
	)
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "results.json"))
		if err != nil {
			return err
		}
		var res results
		if err := json.Unmarshal(b, &res); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		runs = append(runs, fmt.Sprintf("- `%s`: started %s, load average %s", dir, res.Started, res.Machine.LoadAvg))
		figures.add(&res)
		for _, t := range res.Targets {
			name := stableName(t.Name)
			r := rows[name]
			if r == nil {
				r = &row{goal: t.Goal, limit: t.Limit, atMost: t.AtMost, hasLimit: t.Limit != 0}
				rows[name] = r
				order = append(order, name)
			}
			r.values = append(r.values, t.Measured)
			if t.Met {
				r.met++
			}
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "# Targets over %d runs\n\nThe median of each target over the runs below (a target missing from a run is left out of its median).\n\n", len(dirs))
	sb.WriteString(strings.Join(runs, "\n"))
	sb.WriteString("\n\n| target | runs | median | goal | met by the median |\n|---|---|---:|---|---|\n")
	for _, name := range order {
		r := rows[name]
		m := median(r.values)
		met := r.met*2 > len(r.values)
		if r.hasLimit {
			met = m <= r.limit
			if !r.atMost {
				met = m >= r.limit
			}
			if strings.HasPrefix(r.goal, "<") {
				met = m < r.limit
			}
		}
		vals := make([]string, len(r.values))
		for i, v := range r.values {
			vals[i] = fmt.Sprintf("%.2f", v)
		}
		fmt.Fprintf(&sb, "| %s | %s | %.2f | %s | %s |\n", name, strings.Join(vals, " / "), m, r.goal, yesNo(met))
	}
	sb.WriteString(figures.markdown())
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "medians.md"), []byte(sb.String()), 0o644)
}

// figureTable collects, per figure, the value of each run.
type figureTable struct {
	order  []string
	values map[string][]float64
}

func (f *figureTable) put(name string, v float64) {
	if f.values == nil {
		f.values = map[string][]float64{}
	}
	if _, ok := f.values[name]; !ok {
		f.order = append(f.order, name)
	}
	f.values[name] = append(f.values[name], v)
}

// add takes the figures of one run: each compare run's rates and CPU per
// message, each latency run's p50, p99 and CPU per message, and each idle
// run's CPU per second.
func (f *figureTable) add(res *results) {
	for _, r := range res.Runs {
		if !r.Complete && r.System != sysCeiling {
			continue
		}
		key := fmt.Sprintf("compare, %s, %s, %d/tx: ", systemLabel[r.System], r.Mode, r.PerTx)
		switch r.Mode {
		case modePublish:
			f.put(key+"publish msg/s", r.PublishRate)
		case modeSteady:
			f.put(key+"publish msg/s", r.PublishRate)
			f.put(key+"end-to-end msg/s", r.EndToEndRate)
			f.put(key+"CPU µs/msg", r.CPUMicrosPerMessage)
		case modeBacklog:
			f.put(key+"drain msg/s", r.DrainRate)
			f.put(key+"drain CPU µs/msg", r.DrainCPUMicrosPerMessage)
		}
	}
	for _, l := range res.Latency {
		if !l.Complete {
			continue
		}
		key := fmt.Sprintf("latency, %s, %d msg/s: ", l.label(), l.OfferedRate)
		if l.System == sysCeiling {
			f.put(key+"CPU µs/msg", l.CPUMicrosPerMessage)
			continue
		}
		f.put(key+"p50 ms", l.Latency.P50Ms)
		f.put(key+"p99 ms", l.Latency.P99Ms)
		f.put(key+"CPU µs/msg", l.CPUMicrosPerMessage)
	}
	for _, r := range res.Idle {
		f.put(fmt.Sprintf("idle, %s: CPU ms/s", r.label()), r.total())
	}
}

// markdown is the table of every figure's runs and median.
func (f *figureTable) markdown() string {
	if len(f.order) == 0 {
		return ""
	}
	var sb strings.Builder
	sb.WriteString("\n## Every figure\n\nEach run's value and the median (a run where a system did not finish is left out).\n\n| figure | runs | median |\n|---|---|---:|\n")
	for _, name := range f.order {
		vs := f.values[name]
		vals := make([]string, len(vs))
		for i, v := range vs {
			vals[i] = fmt.Sprintf("%.1f", v)
		}
		fmt.Fprintf(&sb, "| %s | %s | %.1f |\n", name, strings.Join(vals, " / "), median(vs))
	}
	return sb.String()
}
