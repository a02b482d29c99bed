package main

import (
	"fmt"
	"image"
	"image/color"
	"math"
	"strconv"
)

// The plots are drawn with gonum/plot: charts of line series on linear or
// logarithmic axes, with grid lines and a legend, stacked into one PNG.

const (
	panelW, panelH = 1000, 320
	marginL        = 80
	marginR        = 30
	marginT        = 40
	marginB        = 40
)

var (
	colPeer      = color.RGBA{200, 30, 30, 255}
	colPeerPub   = color.RGBA{240, 160, 160, 255}
	colOutbox    = color.RGBA{30, 60, 200, 255}
	colOutboxPub = color.RGBA{150, 170, 240, 255}
	// (c') at least once: green.
	colOutboxALO    = color.RGBA{20, 140, 60, 255}
	colOutboxALOPub = color.RGBA{140, 210, 160, 255}
	colOutboxWAL    = color.RGBA{0, 150, 160, 255}
	colOutboxWALPub = color.RGBA{150, 215, 220, 255}
	colRiver        = color.RGBA{130, 60, 170, 255}
	colPeerTuned    = color.RGBA{200, 120, 20, 255}
	colPeerTunedPub = color.RGBA{240, 200, 140, 255}
	colRiverPub     = color.RGBA{200, 160, 225, 255}
	colTarget       = color.RGBA{0, 150, 60, 255}
)

type point struct{ x, y float64 }

// series is one line of a chart.
type series struct {
	name    string
	col     color.RGBA
	pts     []point
	markers bool // a dot at each point
}

// axis maps values to 0..1 along a chart's side.
type axis struct {
	min, max float64
	log      bool      // log10 scale (min > 0)
	ticks    []float64 // labelled, with a grid line
	unit     string
}

// linAxis is 0 … a round number ≥ top (1, 2, 4, 5 or 8 times a power of
// ten), with ticks at round steps.
func linAxis(top float64, unit string) axis {
	m := niceCeil(math.Max(top, 1e-9))
	n := 4
	if mant := m / math.Pow(10, math.Floor(math.Log10(m)+1e-9)); math.Abs(mant-5) < 1e-6 {
		n = 5
	}
	a := axis{min: 0, max: m, unit: unit}
	for k := 0; k <= n; k++ {
		a.ticks = append(a.ticks, m*float64(k)/float64(n))
	}
	return a
}

// logAxis spans the decades around lo … hi (lo > 0), a tick per decade.
func logAxis(lo, hi float64, unit string) axis {
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi <= dlo {
		dhi = dlo + 1
	}
	a := axis{min: math.Pow(10, dlo), max: math.Pow(10, dhi), log: true, unit: unit}
	for d := dlo; d <= dhi; d++ {
		a.ticks = append(a.ticks, math.Pow(10, d))
	}
	return a
}

// frac is v's position on the axis, clamped to 0..1.
func (a axis) frac(v float64) float64 {
	var f float64
	if a.log {
		v = math.Max(v, a.min)
		f = (math.Log10(v) - math.Log10(a.min)) / (math.Log10(a.max) - math.Log10(a.min))
	} else {
		f = (v - a.min) / (a.max - a.min)
	}
	return math.Min(1, math.Max(0, f))
}

// vline is a labelled vertical line at x (a target, say).
type vline struct {
	x     float64
	col   color.RGBA
	label string
}

// Legend positions.
const (
	legendTopLeft = iota
	legendTopRight
	legendBottomRight
)

// chart is one panel: a title, two axes, lines, and where the legend goes.
type chart struct {
	title  string
	x, y   axis
	series []series
	vlines []vline
	legend int
}

// fmtNum labels a tick: 0, 0.25, 12.5, 200, 1.5K, 2M.
func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case v == 0:
		return "0"
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case a >= 1e4 || a >= 1e3 && math.Mod(v, 100) == 0:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "K"
	default:
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
}

func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 4, 5, 8, 10} {
		if v <= m*p*(1+1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// rates turns samples into the rate at the broker (or of publishing) over
// a sliding window of about one second, at times shifted by -from
// (samples before from are left out).
func rates(samples []sample, published bool, from float64) []point {
	var out []point
	j := 0
	for i := range samples {
		if samples[i].T < from {
			j = i
			continue
		}
		for j < i && samples[i].T-samples[j].T > 1.0 {
			j++
		}
		if j == i {
			if i == 0 {
				continue
			}
			j = i - 1
		}
		dt := samples[i].T - samples[j].T
		if dt <= 0 {
			continue
		}
		dn := samples[i].AtBroker - samples[j].AtBroker
		if published {
			dn = samples[i].Published - samples[j].Published
		}
		out = append(out, point{samples[i].T - from, float64(dn) / dt})
	}
	return out
}

// throughputImage: per -per-tx value, a panel of the steady runs (rate at
// the broker, and lighter the publish rate, against seconds since the
// first publish) and one of the backlog runs' drains (rate at the broker
// against seconds since the relay started); (b) red, (c) blue.
func throughputImage(runs []*runResult) (image.Image, error) {
	var perTxs []int
	seen := map[int]bool{}
	for _, r := range runs {
		if r.System != sysCeiling && !seen[r.PerTx] {
			seen[r.PerTx] = true
			perTxs = append(perTxs, r.PerTx)
		}
	}
	name := map[string]string{sysPeer: "(b) peer", sysPeerTuned: "(b') tuned", sysRiver: "(d) River", sysOutbox: "(c) outbox", sysOutboxALO: "(c') at least once", sysOutboxWAL: "(e) log-based"}
	dark := map[string]color.RGBA{sysPeer: colPeer, sysPeerTuned: colPeerTuned, sysRiver: colRiver, sysOutbox: colOutbox, sysOutboxALO: colOutboxALO, sysOutboxWAL: colOutboxWAL}
	light := map[string]color.RGBA{sysPeer: colPeerPub, sysPeerTuned: colPeerTunedPub, sysRiver: colRiverPub, sysOutbox: colOutboxPub, sysOutboxALO: colOutboxALOPub, sysOutboxWAL: colOutboxWALPub}
	var charts []chart
	for _, perTx := range perTxs {
		for _, mode := range []string{modeSteady, modeBacklog} {
			var ss []series
			for _, r := range runs {
				if r.PerTx != perTx || r.Mode != mode {
					continue
				}
				if mode == modeSteady {
					ss = append(ss, series{name: name[r.System] + " published", col: light[r.System], pts: rates(r.Samples, true, 0)})
					ss = append(ss, series{name: name[r.System] + " at broker", col: dark[r.System], pts: rates(r.Samples, false, 0)})
				} else {
					ss = append(ss, series{name: name[r.System] + " at broker", col: dark[r.System], pts: rates(r.Samples, false, r.RelayStartSeconds)})
				}
			}
			if len(ss) == 0 {
				continue
			}
			title := fmt.Sprintf("%d/tx steady: relay running while publishing", perTx)
			xunit := "s since first publish"
			if mode == modeBacklog {
				title = fmt.Sprintf("%d/tx backlog drain: relay started after the last commit", perTx)
				xunit = "s since relay start"
			}
			charts = append(charts, seriesChart(title, xunit, "msg/s", ss, legendTopRight))
		}
	}
	return drawCharts(charts, "no compare runs of (b) or (c)")
}

// seriesChart is a chart with linear axes fitted to ss.
func seriesChart(title, xunit, yunit string, ss []series, legend int) chart {
	maxX, maxY := 0.0, 0.0
	for _, s := range ss {
		for _, p := range s.pts {
			maxX, maxY = math.Max(maxX, p.x), math.Max(maxY, p.y)
		}
	}
	return chart{title: title, x: linAxis(math.Max(maxX, 1), xunit), y: linAxis(math.Max(maxY, 1), yunit), series: ss, legend: legend}
}
