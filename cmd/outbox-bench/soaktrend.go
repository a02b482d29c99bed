package main

import (
	"cmp"
	"fmt"
	"image"
	"image/color"
	"maps"
	"math"
	"slices"
	"strings"
)

// trend is one soak metric over the samples after the warm-up: a line
// fitted by least squares, and a verdict.
type trend struct {
	Metric string `json:"metric"`
	Unit   string `json:"unit"`
	// First and Last are the means of the first and last five samples
	// after the warm-up.
	First float64 `json:"first"`
	Last  float64 `json:"last"`
	Mean  float64 `json:"mean"`
	// Max is the largest sample after the warm-up: the bound of a
	// sawtooth (dead rows between two vacuums).
	Max float64 `json:"max"`
	// SlopePerHour is the fitted line's slope.
	SlopePerHour float64 `json:"slope_per_hour"`
	// Noise is the samples' standard deviation around the line.
	Noise   float64 `json:"noise"`
	Verdict string  `json:"verdict"`
}

// Verdicts. A metric is flat when the fitted line moves less over the run
// than its noise (or 5% of its mean, or the metric's resolution, whichever
// is largest); bounded when it moved but is flat over the second half of
// the run (it levelled off); growing (or falling) otherwise.
const (
	verdictFlat     = "flat"
	verdictBounded  = "bounded (levelled off)"
	verdictGrowing  = "growing"
	verdictFalling  = "falling"
	verdictTooShort = "too few samples"
)

// soakMetric is a series of the samples.
type soakMetric struct {
	name, unit string
	// resolution: a change smaller than this is no change (a connection,
	// a goroutine, 0.1 MiB, a hundred rows).
	resolution float64
	value      func(s soakSample) (float64, bool)
}

func (s *soakResult) metrics() []soakMetric {
	ms := []soakMetric{
		{"commit→broker p50", "ms", 0.5, func(x soakSample) (float64, bool) { return x.P50Ms, true }},
		{"commit→broker p99", "ms", 0.5, func(x soakSample) (float64, bool) { return x.P99Ms, true }},
		{"CPU per message, this process", "µs", 5, func(x soakSample) (float64, bool) { return x.ProcessMicros, true }},
		{"CPU per message, PostgreSQL", "µs", 5, func(x soakSample) (float64, bool) { return x.PostgresMicros, true }},
		{"RSS of this process", "MiB", 1, func(x soakSample) (float64, bool) { return mib(x.RSSBytes), true }},
		{"Go heap in use", "MiB", 1, func(x soakSample) (float64, bool) { return mib(x.HeapInuseBytes), true }},
		{"goroutines", "", 2, func(x soakSample) (float64, bool) { return float64(x.Goroutines), true }},
		{"client connections", "", 1, func(x soakSample) (float64, bool) { return float64(x.Connections), true }},
	}
	for _, q := range s.topStatements() {
		ms = append(ms, soakMetric{"mean time of `" + squeeze(q, 60) + "`", "ms", 0.05, func(x soakSample) (float64, bool) {
			for _, st := range x.Statements {
				if st.Query == q {
					return st.MeanMs, true
				}
			}
			return 0, false
		}})
	}
	for _, name := range s.tableNames() {
		table := func(x soakSample) (tableSample, bool) {
			for _, t := range x.Tables {
				if t.Name == name {
					return t, true
				}
			}
			return tableSample{}, false
		}
		ms = append(ms,
			soakMetric{name + ": size on disk", "MiB", 0.1, func(x soakSample) (float64, bool) {
				t, ok := table(x)
				return mib(t.Bytes), ok
			}},
			soakMetric{name + ": live rows", "", 100, func(x soakSample) (float64, bool) {
				t, ok := table(x)
				return float64(t.LiveRows), ok
			}},
			soakMetric{name + ": dead rows", "", 100, func(x soakSample) (float64, bool) {
				t, ok := table(x)
				return float64(t.DeadRows), ok
			}},
		)
	}
	return ms
}

// topStatements are the 3 statements with the most execution time over
// the samples (those in a sample's top list).
func (s *soakResult) topStatements() []string {
	total := map[string]float64{}
	for _, x := range s.Samples {
		for _, st := range x.Statements {
			total[st.Query] += st.TotalMs
		}
	}
	qs := slices.Collect(maps.Keys(total))
	slices.SortFunc(qs, func(a, b string) int { return cmp.Or(cmp.Compare(total[b], total[a]), strings.Compare(a, b)) })
	return qs[:min(3, len(qs))]
}

// tableNames are the tables of the samples, in the order first seen.
func (s *soakResult) tableNames() []string {
	var names []string
	seen := map[string]bool{}
	for _, x := range s.Samples {
		for _, t := range x.Tables {
			if !seen[t.Name] {
				seen[t.Name] = true
				names = append(names, t.Name)
			}
		}
	}
	return names
}

// trends fits each metric over the samples after the warm-up.
func (s *soakResult) trends() []trend {
	var out []trend
	for _, m := range s.metrics() {
		var xs, ys []float64
		for _, x := range s.Samples {
			if x.Seconds <= s.WarmupSeconds {
				continue
			}
			if v, ok := m.value(x); ok {
				xs, ys = append(xs, x.Seconds/3600), append(ys, v)
			}
		}
		out = append(out, judge(m.name, m.unit, m.resolution, xs, ys))
	}
	return out
}

// judge fits a line to (xs hours, ys) and gives the verdict.
func judge(metric, unit string, resolution float64, xs, ys []float64) trend {
	t := trend{Metric: metric, Unit: unit, Verdict: verdictTooShort}
	if len(xs) < 6 {
		return t
	}
	k := min(5, len(ys)/3)
	t.First, t.Last, t.Mean, t.Max = mean(ys[:k]), mean(ys[len(ys)-k:]), mean(ys), slices.Max(ys)
	slope, noise := fitLine(xs, ys)
	t.SlopePerHour, t.Noise = slope, noise
	tolerance := func(noise, mean float64) float64 { return max(noise, 0.05*math.Abs(mean), resolution) }
	change := slope * (xs[len(xs)-1] - xs[0])
	if math.Abs(change) <= tolerance(noise, t.Mean) {
		t.Verdict = verdictFlat
		return t
	}
	half := len(xs) / 2
	slope2, noise2 := fitLine(xs[half:], ys[half:])
	if math.Abs(slope2*(xs[len(xs)-1]-xs[half])) <= tolerance(noise2, mean(ys[half:])) {
		t.Verdict = verdictBounded
		return t
	}
	t.Verdict = verdictGrowing
	if change < 0 {
		t.Verdict = verdictFalling
	}
	return t
}

// fitLine is the least-squares line through the points: its slope, and
// the standard deviation of the points around it.
func fitLine(xs, ys []float64) (slope, noise float64) {
	mx, my := mean(xs), mean(ys)
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx > 0 {
		slope = sxy / sxx
	}
	var ss float64
	for i := range xs {
		r := ys[i] - (my + slope*(xs[i]-mx))
		ss += r * r
	}
	if len(xs) > 2 {
		noise = math.Sqrt(ss / float64(len(xs)-2))
	}
	return slope, noise
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

// soakMarkdown renders the soak: the run, the trends and the samples.
func (res *results) soakMarkdown(sb *strings.Builder) {
	s := res.Soak
	if s == nil {
		return
	}
	fmt.Fprintf(sb, "## Soak: %d msg/s for %s, retention on\n\n", s.Rate, fmtSeconds(s.DurationSeconds))
	fmt.Fprintf(sb, "(c) with `adaptive.Default()`, %d partitions, %d message(s) per transaction from %d publishers, the retention Vacuum "+
		"(KeepFor %s, every %v), autovacuum_naptime %s. A sample every %s; the trends leave out the first %s (warm-up) and fit a line "+
		"to the rest: **flat** when it moves less over the run than the samples' noise around it (or 5%% of the mean, or the "+
		"metric's resolution), **bounded** when it moved but is flat over the second half, **growing** otherwise. "+
		"CPU of this process includes the in-process Kafka broker and the consumer.\n\n",
		s.Partitions, s.PerTx, s.Publishers, fmtSeconds(s.KeepForSeconds), vacuumInterval, s.Naptime, fmtSeconds(s.IntervalSeconds), fmtSeconds(s.WarmupSeconds))
	if s.TableDefaults {
		sb.WriteString("**The tables ran on PostgreSQL's storage parameters** (`-soak-table-defaults`), not on those `Migrate` sets.\n\n")
	}
	if r := s.Run; r != nil {
		fmt.Fprintf(sb, "Delivered %d of %d (%d duplicates)%s; commit→broker over the run p50 %.1f ms, p99 %.1f ms; CPU %.0f µs/msg; peak RSS %d MiB.\n\n",
			r.Delivered, r.Messages, r.Duplicates, map[bool]string{true: "", false: ", **incomplete**"}[r.Complete],
			r.Latency.P50Ms, r.Latency.P99Ms, r.CPUMicrosPerMessage, r.PeakRSSBytes>>20)
	}
	sb.WriteString("| metric | first | last | max | slope per hour | noise (σ) | verdict |\n|---|---|---|---|---|---|---|\n")
	for _, t := range s.Trends {
		unit := ""
		if t.Unit != "" {
			unit = " " + t.Unit
		}
		fmt.Fprintf(sb, "| %s | %s%s | %s%s | %s%s | %+.2f%s/h | %s | %s |\n", t.Metric, fmtNum2(t.First), unit, fmtNum2(t.Last), unit, fmtNum2(t.Max), unit, t.SlopePerHour, unit, fmtNum2(t.Noise), t.Verdict)
	}
	sb.WriteString("\n| s | msg/s | p50 ms | p99 ms | CPU µs/msg (process + PostgreSQL) | RSS MiB | goroutines | connections | pending MiB (live/dead rows) | log MiB (live rows) |\n|---|---|---|---|---|---|---|---|---|---|\n")
	step := max(1, len(s.Samples)/20)
	for i, x := range s.Samples {
		if i%step != 0 && i != len(s.Samples)-1 {
			continue
		}
		pending, log := x.table("pending"), x.table("log")
		fmt.Fprintf(sb, "| %.0f | %.0f | %.1f | %.1f | %.0f + %.0f | %d | %d | %d | %.1f (%d/%d) | %.1f (%d) |\n",
			x.Seconds, x.WindowRate, x.P50Ms, x.P99Ms, x.ProcessMicros, x.PostgresMicros, x.RSSBytes>>20, x.Goroutines, x.Connections,
			mib(pending.Bytes), pending.LiveRows, pending.DeadRows, mib(log.Bytes), log.LiveRows)
	}
	sb.WriteString("\n")
}

func (x soakSample) table(name string) tableSample {
	for _, t := range x.Tables {
		if t.Name == name {
			return t
		}
	}
	return tableSample{}
}

// fmtSeconds renders a duration in seconds as 30s, 5m or 1h30m.
func fmtSeconds(s float64) string {
	d := int(math.Round(s))
	switch {
	case d >= 3600 && d%60 == 0:
		if d%3600 == 0 {
			return fmt.Sprintf("%dh", d/3600)
		}
		return fmt.Sprintf("%dh%dm", d/3600, d%3600/60)
	case d >= 60 && d%60 == 0:
		return fmt.Sprintf("%dm", d/60)
	}
	return fmt.Sprintf("%ds", d)
}

// fmtNum2 renders v with two decimals below 100, none from 100 on.
func fmtNum2(v float64) string {
	if math.Abs(v) >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// tableColors are the colors of the tables' series, in order.
var tableColors = []color.RGBA{
	{30, 60, 200, 255}, {20, 150, 60, 255}, {200, 30, 30, 255}, {240, 140, 40, 255}, {130, 60, 170, 255},
	{0, 150, 160, 255}, {120, 120, 120, 255}, {200, 120, 20, 255}, {90, 90, 30, 255}, {230, 90, 170, 255},
	{40, 40, 40, 255}, {150, 170, 240, 255},
}

// soakImage draws the soak's samples over time: latency, CPU per message,
// memory, goroutines and connections, the tables' sizes and dead rows.
func soakImage(s *soakResult) (image.Image, error) {
	if s == nil || len(s.Samples) == 0 {
		return drawCharts(nil, "no soak")
	}
	line := func(name string, col color.RGBA, value func(soakSample) float64) series {
		sr := series{name: name, col: col, markers: len(s.Samples) <= 60}
		for _, x := range s.Samples {
			sr.pts = append(sr.pts, point{x.Seconds / 60, value(x)})
		}
		return sr
	}
	const xunit = "minutes since the first publish"
	title := fmt.Sprintf("soak, %d msg/s, retention on: ", s.Rate)
	charts := []chart{
		seriesChart(title+"commit to broker latency (per sample)", xunit, "ms", []series{
			line("p50", colP50, func(x soakSample) float64 { return x.P50Ms }),
			line("p99", colOutbox, func(x soakSample) float64 { return x.P99Ms }),
		}, legendTopLeft),
		seriesChart(title+"CPU per message", xunit, "µs/msg", []series{
			line("this process (with the Kafka broker)", colOutbox, func(x soakSample) float64 { return x.ProcessMicros }),
			line("PostgreSQL", colPeer, func(x soakSample) float64 { return x.PostgresMicros }),
		}, legendTopLeft),
		seriesChart(title+"memory", xunit, "MiB", []series{
			line("RSS", colRSS, func(x soakSample) float64 { return mib(x.RSSBytes) }),
			line("Go heap in use", colHeap, func(x soakSample) float64 { return mib(x.HeapInuseBytes) }),
		}, legendTopLeft),
		seriesChart(title+"goroutines and client connections", xunit, "count", []series{
			line("goroutines", colOutbox, func(x soakSample) float64 { return float64(x.Goroutines) }),
			line("client connections", colPeer, func(x soakSample) float64 { return float64(x.Connections) }),
		}, legendTopLeft),
	}
	var sizes, dead []series
	for i, name := range s.tableNames() {
		col := tableColors[i%len(tableColors)]
		sizes = append(sizes, line(name, col, func(x soakSample) float64 { return mib(x.table(name).Bytes) }))
		dead = append(dead, line(name, col, func(x soakSample) float64 { return float64(x.table(name).DeadRows) }))
	}
	charts = append(charts,
		logChart(seriesChart(title+"outbox tables' size on disk (with indexes; log scale)", xunit, "MiB", sizes, legendTopLeft)),
		logChart(seriesChart(title+"outbox tables' dead rows (pg_stat_user_tables; log scale, 0 left out)", xunit, "rows", dead, legendTopLeft)),
	)
	// The x axis ends where the soak did.
	for i := range charts {
		charts[i].x = linAxisTo(s.DurationSeconds/60, xunit)
	}
	return drawCharts(charts, "no soak")
}

// logChart puts c's y axis on a log scale, over its positive values (the
// others left out), so that tables of kilobytes and of megabytes show side
// by side.
func logChart(c chart) chart {
	lo, hi := math.Inf(1), 0.0
	for i := range c.series {
		pts := c.series[i].pts[:0:0]
		for _, p := range c.series[i].pts {
			if p.y > 0 {
				pts = append(pts, p)
				lo, hi = math.Min(lo, p.y), math.Max(hi, p.y)
			}
		}
		c.series[i].pts = pts
	}
	if hi > 0 {
		c.y = logAxis(lo, hi, c.y.unit)
	}
	return c
}

// linAxisTo is 0 … top, with five ticks.
func linAxisTo(top float64, unit string) axis {
	top = math.Max(top, 1e-9)
	a := axis{max: top, unit: unit}
	for k := 0; k <= 4; k++ {
		a.ticks = append(a.ticks, top*float64(k)/4)
	}
	return a
}
