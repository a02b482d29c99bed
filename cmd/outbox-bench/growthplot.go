package main

import (
	"fmt"
	"image"
	"image/color"
	"math"
)

var (
	colP50     = color.RGBA{120, 150, 230, 255}
	colRSS     = color.RGBA{200, 30, 30, 255}
	colHeap    = color.RGBA{240, 140, 40, 255}
	colLogSize = color.RGBA{30, 60, 200, 255}
	colPending = color.RGBA{20, 150, 60, 255}
)

// growthImage draws the growth curves: (a) the window end-to-end rate and
// (a) the window latency against the history delivered, (b) memory and
// table sizes against the history delivered, (c) the end-to-end rate
// against the partition count.
func growthImage(g *growthResult) (image.Image, error) {
	var charts []chart
	if g != nil && g.History != nil && len(g.History.Points) > 0 {
		charts = append(charts, historyCharts(g.History)...)
	}
	if g != nil && g.HistoryPaced != nil && len(g.HistoryPaced.Points) > 0 {
		charts = append(charts, historyCharts(g.HistoryPaced)...)
	}
	if g != nil && len(g.Partitions) > 0 {
		charts = append(charts, partitionsChart(g.Partitions))
	}
	return drawCharts(charts, "no growth runs")
}

func historyCharts(h *historyResult) []chart {
	var rate, p50, p99, rss, heap, logSize, pending series
	rate = series{name: "outbox: end-to-end msg/s in the window", col: colOutbox, markers: true}
	p50 = series{name: "window p50", col: colP50, markers: true}
	p99 = series{name: "window p99", col: colOutbox, markers: true}
	rss = series{name: "RSS of this process", col: colRSS, markers: true}
	heap = series{name: "Go heap in use", col: colHeap, markers: true}
	logSize = series{name: "log table + indexes", col: colLogSize, markers: true}
	pending = series{name: "pending table + indexes", col: colPending, markers: true}
	maxX := 0.0
	for i, p := range h.Points {
		x := float64(p.Delivered)
		maxX = math.Max(maxX, x)
		if i > 0 {
			rate.pts = append(rate.pts, point{x, p.WindowRate})
			p50.pts = append(p50.pts, point{x, p.WindowP50Ms})
			p99.pts = append(p99.pts, point{x, p.WindowP99Ms})
		}
		rss.pts = append(rss.pts, point{x, mib(p.RSSBytes)})
		heap.pts = append(heap.pts, point{x, mib(p.HeapInuseBytes)})
		logSize.pts = append(logSize.pts, point{x, mib(p.LogBytes)})
		pending.pts = append(pending.pts, point{x, mib(p.PendingBytes)})
	}
	xunit := "messages delivered (history)"
	fit := func(title, yunit string, legend int, ss ...series) chart {
		c := seriesChart(title, xunit, yunit, ss, legend)
		c.x = linAxis(math.Max(maxX, 1), xunit)
		return c
	}
	title := fmt.Sprintf("(a) history: %d partitions, retention on, unpaced", h.Partitions)
	memTitle := "(b) memory and table sizes as the history grows, unpaced"
	if h.OfferedRate > 0 {
		memTitle = fmt.Sprintf("(d) memory and table sizes as the history grows, %d msg/s offered", h.OfferedRate)
		title = fmt.Sprintf("(c) history: %d partitions, retention on, %d msg/s offered", h.Partitions, h.OfferedRate)
	}
	return []chart{
		fit(title+", throughput", "msg/s", legendBottomRight, rate),
		fit(title+", commit to broker latency", "ms", legendTopLeft, p50, p99),
		fit(memTitle, "MiB", legendTopLeft, rss, heap, logSize, pending),
	}
}

func partitionsChart(runs []*growthRun) chart {
	rate := series{name: "outbox: end-to-end msg/s", col: colOutbox, markers: true}
	lo, hi, top := math.Inf(1), 0.0, 0.0
	var ticks []float64
	for _, r := range runs {
		x := float64(r.Partitions)
		rate.pts = append(rate.pts, point{x, r.EndToEndRate})
		lo, hi, top = math.Min(lo, x), math.Max(hi, x), math.Max(top, r.EndToEndRate)
		ticks = append(ticks, x)
	}
	x := logAxis(lo, hi, "partitions (log scale)")
	// Label the partition counts measured rather than the decades.
	x.ticks = ticks
	if lo == hi {
		x = linAxis(hi*2, "partitions")
	} else {
		x.min, x.max = lo/1.25, hi*1.25
	}
	return chart{
		title:  fmt.Sprintf("(e) partitions: outbox, %d messages each, %d/tx, unpaced", runs[0].Messages, runs[0].PerTx),
		x:      x,
		y:      linAxis(math.Max(top, 1), "msg/s"),
		series: []series{rate},
		legend: legendBottomRight,
	}
}
