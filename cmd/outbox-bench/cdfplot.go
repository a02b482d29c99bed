package main

import (
	"fmt"
	"image"
	"image/color"
	"math"
)

// Colours of the latency curves: (b) in warm, (c) in cool colours, one
// per offered load, darker for higher loads.
var (
	peerCurveCols   = []color.RGBA{{240, 120, 40, 255}, {200, 30, 30, 255}, {130, 20, 90, 255}, {120, 80, 20, 255}}
	outboxCurveCols = []color.RGBA{{20, 170, 200, 255}, {30, 60, 200, 255}, {20, 130, 60, 255}, {90, 40, 180, 255}}
)

// latencyImage draws the commit→broker latency CDF of every latency run in
// one chart: x the latency in ms on a log scale, y the fraction of the
// messages with at most that latency, one curve per system and load, a
// dashed line at the 25 ms target.
func latencyImage(runs []*latencyResult) (image.Image, error) {
	lo, hi := math.Inf(1), 0.0
	for _, r := range runs {
		for _, p := range r.CDF {
			if p.Ms > 0 {
				lo = math.Min(lo, p.Ms)
			}
			hi = math.Max(hi, p.Ms)
		}
	}
	if hi == 0 {
		return drawCharts(nil, "no latency runs")
	}
	lo = math.Max(lo, 0.01)
	x := logAxis(lo, math.Max(hi, 30), "latency ms (log scale)")
	y := linAxis(1, "fraction of messages")
	loadIndex := map[string]int{}
	var ss []series
	for _, r := range runs {
		if r.System == sysCeiling { // publish only: no latency
			continue
		}
		cols := outboxCurveCols
		label := map[string]string{sysPeer: "(b) peer", sysPeerTuned: "(b') tuned", sysRiver: "(d) River", sysOutboxALO: "(c') at least once", sysOutboxWAL: "(e) log-based"}[r.System]
		if label == "" {
			label = "(c) outbox"
		}
		if r.System == sysPeer || r.System == sysPeerTuned || r.System == sysRiver {
			cols = peerCurveCols
		}
		if r.Tuning == "adaptive.Default()" {
			label += ", Default()"
		}
		family := r.System
		if r.System != sysOutbox && r.System != sysOutboxALO && r.System != sysOutboxWAL {
			family = "peers"
		}
		i := loadIndex[family]
		loadIndex[family]++
		s := series{
			name: fmt.Sprintf("%s %d msg/s: p50 %s p99 %s ms", label, r.OfferedRate, fmtMs(r.Latency.P50Ms), fmtMs(r.Latency.P99Ms)),
			col:  cols[i%len(cols)],
		}
		for _, p := range r.CDF {
			s.pts = append(s.pts, point{math.Max(p.Ms, x.min), p.Frac})
		}
		ss = append(ss, s)
	}
	c := chart{
		title:  "commit to broker latency, cumulative distribution",
		x:      x,
		y:      y,
		series: ss,
		vlines: []vline{{x: 25, col: colTarget, label: "25 ms"}},
		legend: legendBottomRight,
	}
	return drawChartsSized([]chart{c}, "", 2)
}

// fmtMs formats a latency in ms with 3 significant digits.
func fmtMs(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
