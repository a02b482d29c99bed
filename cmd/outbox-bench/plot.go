package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strconv"
)

// The plots are drawn with the standard library only: charts of line
// series on linear or logarithmic axes, labelled with the bitmap font of
// font.go, each with a legend box inside the plot area.

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
	colAxis      = color.RGBA{0, 0, 0, 255}
	colGrid      = color.RGBA{225, 225, 225, 255}
	colMuted     = color.RGBA{110, 110, 110, 255}
	colTarget    = color.RGBA{0, 150, 60, 255}
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

// draw draws the chart into r of img.
func (c chart) draw(img *image.RGBA, r image.Rectangle) {
	x0, y0 := r.Min.X+marginL, r.Max.Y-marginB
	x1, y1 := r.Max.X-marginR, r.Min.Y+marginT
	px := func(v float64) int { return x0 + int(math.Round(c.x.frac(v)*float64(x1-x0))) }
	py := func(v float64) int { return y0 - int(math.Round(c.y.frac(v)*float64(y0-y1))) }

	text(img, r.Min.X+10, r.Min.Y+8, c.title, colAxis)
	text(img, r.Min.X+10, y1-textHeight-6, c.y.unit, colMuted)
	for _, v := range c.y.ticks {
		y := py(v)
		line(img, x0, y, x1, y, colGrid, 1)
		l := fmtNum(v)
		text(img, x0-8-textWidth(l), y-textHeight/2, l, colAxis)
	}
	for _, v := range c.x.ticks {
		x := px(v)
		line(img, x, y0, x, y1, colGrid, 1)
		l := fmtNum(v)
		text(img, min(max(x-textWidth(l)/2, r.Min.X), x1-textWidth(l)), y0+8, l, colAxis)
	}
	text(img, x1-textWidth(c.x.unit), y0+8+textHeight+6, c.x.unit, colMuted)
	line(img, x0, y0, x1, y0, colAxis, 1)
	line(img, x0, y0, x0, y1, colAxis, 1)
	for _, v := range c.vlines {
		x := px(v.x)
		for y := y1; y < y0; y += 8 {
			line(img, x, y, x, min(y+4, y0), v.col, 2)
		}
		fill(img, image.Rect(x+3, y1+2, x+9+textWidth(v.label), y1+6+textHeight), color.RGBA{255, 255, 255, 255})
		text(img, x+6, y1+4, v.label, v.col)
	}
	for _, s := range c.series {
		for i := 1; i < len(s.pts); i++ {
			line(img, px(s.pts[i-1].x), py(s.pts[i-1].y), px(s.pts[i].x), py(s.pts[i].y), s.col, 2)
		}
		if s.markers {
			for _, p := range s.pts {
				fill(img, image.Rect(px(p.x)-3, py(p.y)-3, px(p.x)+4, py(p.y)+4), s.col)
			}
		}
	}
	c.drawLegend(img, image.Rect(x0, y1, x1, y0))
}

// drawLegend draws a box with a colour swatch and the name of each series
// in a corner of the plot area.
func (c chart) drawLegend(img *image.RGBA, area image.Rectangle) {
	var named []series
	w := 0
	for _, s := range c.series {
		if s.name != "" {
			named = append(named, s)
			w = max(w, textWidth(s.name))
		}
	}
	if len(named) == 0 {
		return
	}
	const pad, row = 8, textHeight + 8
	bw, bh := pad+22+w+pad, pad+len(named)*row-8+pad
	var at image.Point
	switch c.legend {
	case legendTopLeft:
		at = image.Pt(area.Min.X+12, area.Min.Y+8)
	case legendTopRight:
		at = image.Pt(area.Max.X-12-bw, area.Min.Y+8)
	default:
		at = image.Pt(area.Max.X-12-bw, area.Max.Y-12-bh)
	}
	box := image.Rect(at.X, at.Y, at.X+bw, at.Y+bh)
	fill(img, box, color.RGBA{255, 255, 255, 255})
	line(img, box.Min.X, box.Min.Y, box.Max.X, box.Min.Y, colMuted, 1)
	line(img, box.Min.X, box.Max.Y, box.Max.X, box.Max.Y, colMuted, 1)
	line(img, box.Min.X, box.Min.Y, box.Min.X, box.Max.Y, colMuted, 1)
	line(img, box.Max.X, box.Min.Y, box.Max.X, box.Max.Y, colMuted, 1)
	for i, s := range named {
		y := at.Y + pad + i*row
		fill(img, image.Rect(at.X+pad, y, at.X+pad+14, y+textHeight), s.col)
		text(img, at.X+pad+22, y, s.name, colAxis)
	}
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

// newImage is a white image of panels stacked panels.
func newImage(panels int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, panelW, panelH*max(1, panels)))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	return img
}

// panelRect is the place of the i-th panel.
func panelRect(i int) image.Rectangle { return image.Rect(0, i*panelH, panelW, (i+1)*panelH) }

// drawCharts stacks charts into one image; none gives a panel saying so.
func drawCharts(charts []chart, none string) *image.RGBA {
	img := newImage(len(charts))
	if len(charts) == 0 {
		text(img, 40, panelH/2, none, colMuted)
	}
	for i, c := range charts {
		c.draw(img, panelRect(i))
	}
	return img
}

func writePNG(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

// line draws a line of width w (Bresenham).
func line(img *image.RGBA, xa, ya, xb, yb int, c color.RGBA, w int) {
	dx, dy := abs(xb-xa), -abs(yb-ya)
	sx, sy := sign(xb-xa), sign(yb-ya)
	e := dx + dy
	for {
		for i := 0; i < w; i++ {
			for j := 0; j < w; j++ {
				img.SetRGBA(xa+i, ya+j, c)
			}
		}
		if xa == xb && ya == yb {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			xa += sx
		}
		if e2 <= dx {
			e += dx
			ya += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
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
func throughputImage(runs []*runResult) *image.RGBA {
	var perTxs []int
	seen := map[int]bool{}
	for _, r := range runs {
		if r.System != sysCeiling && !seen[r.PerTx] {
			seen[r.PerTx] = true
			perTxs = append(perTxs, r.PerTx)
		}
	}
	name := map[string]string{sysPeer: "(b) peer", sysOutbox: "(c) outbox"}
	dark := map[string]color.RGBA{sysPeer: colPeer, sysOutbox: colOutbox}
	light := map[string]color.RGBA{sysPeer: colPeerPub, sysOutbox: colOutboxPub}
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
