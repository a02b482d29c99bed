package console

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// The plot area of a chart, in the SVG's own units (templates/charts.html
// draws the frame; the page scales it).
const (
	chartWidth  = 300.0
	chartHeight = 100.0
)

// chart is one chart of a group's history: its line as SVG path data and
// the labels around it. The page draws it server-side as inline SVG; the
// history API sends the same, and console.js sets the path and the labels
// (as attributes and text, never as markup) to move it without a reload.
type chart struct {
	// ID names the chart in the page ("lag", "lag-seconds", "throughput").
	ID string `json:"id"`
	// Title and Unit are shown above the chart, Label is the SVG's title
	// (for screen readers and as a tooltip): what it shows, of which group
	// on which topic. Label comes from user data: the template escapes it.
	Title string `json:"-"`
	Unit  string `json:"-"`
	Label string `json:"-"`
	// D is the line: "M x y L x y ...", a new "M" after a gap (nobody
	// sampled, or the value is not known); "" when there is no point.
	D string `json:"d"`
	// Points is how many samples the line goes through.
	Points int `json:"points"`
	// Max labels the top of the y axis (the bottom is 0), Now the newest
	// value ("-" when not known).
	Max string `json:"max"`
	Now string `json:"now"`
}

// metric is what one chart draws of a sample.
type metric struct {
	id, title, unit string
	value           func(sample) (float64, bool)
}

var metrics = []metric{
	{"lag", "Lag", "messages", func(s sample) (float64, bool) { return float64(s.Lag), true }},
	{"lag-seconds", "Oldest waiting", "seconds", func(s sample) (float64, bool) { return s.LagSeconds, true }},
	{"throughput", "Throughput", "messages/s", func(s sample) (float64, bool) {
		if s.Throughput == nil {
			return 0, false
		}
		return *s.Throughput, true
	}},
}

// charts draws the samples of group on topic (oldest first) over window,
// the newest at the right edge; samples more than gap apart are not
// joined.
func charts(topic, group string, samples []sample, window, gap time.Duration) []chart {
	out := make([]chart, 0, len(metrics))
	for _, m := range metrics {
		c := chart{ID: m.id, Title: m.title, Unit: m.unit, Label: m.title + " (" + m.unit + ") of consumer group " + group + " on topic " + topic + ", last " + windowText(window), Max: "1", Now: "-"}
		top := 0.0
		for _, s := range samples {
			if v, ok := m.value(s); ok {
				top = max(top, v)
			}
		}
		top = niceCeil(top)
		c.Max = human(top)
		if len(samples) > 0 {
			if v, ok := m.value(samples[len(samples)-1]); ok {
				c.Now = human(v)
			}
			c.D, c.Points = line(samples, m.value, top, window, gap)
		}
		out = append(out, c)
	}
	return out
}

// line is the SVG path of value over samples: x from the window's start
// (0) to the newest sample (chartWidth), y from top (0) to zero
// (chartHeight). A point that follows a gap or an unknown value starts a
// new subpath; a subpath of one point is drawn as a dot (h0, with the
// stylesheet's round caps).
func line(samples []sample, value func(sample) (float64, bool), top float64, window, gap time.Duration) (string, int) {
	end := samples[len(samples)-1].At
	var b strings.Builder
	points, run := 0, 0 // run: points in the current subpath
	var prev time.Time
	for _, s := range samples {
		v, ok := value(s)
		if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
			if run == 1 {
				b.WriteString("h0")
			}
			run = 0
			continue
		}
		if run > 0 && s.At.Sub(prev) > gap {
			if run == 1 {
				b.WriteString("h0")
			}
			run = 0
		}
		x := chartWidth - float64(end.Sub(s.At))/float64(window)*chartWidth
		y := chartHeight - min(max(v, 0)/top, 1)*chartHeight
		if run == 0 {
			b.WriteString("M")
		} else {
			b.WriteString("L")
		}
		b.WriteString(coord(max(x, 0)))
		b.WriteByte(' ')
		b.WriteString(coord(y))
		run++
		points++
		prev = s.At
	}
	if run == 1 {
		b.WriteString("h0")
	}
	return b.String(), points
}

func coord(f float64) string { return trim(f) }

// niceCeil is the top of an axis that shows v: the smallest 1, 2 or 5
// times a power of ten not below it (1 for nothing to show).
func niceCeil(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 0) {
		return 1
	}
	exp := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*exp >= v {
			return m * exp
		}
	}
	return 10 * exp
}

// human writes v briefly: 7, 2.5, 950, 1.2k, 3.4M.
func human(v float64) string {
	for _, u := range []struct {
		div    float64
		suffix string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if math.Abs(v) >= u.div {
			return trim(v/u.div) + u.suffix
		}
	}
	return trim(v)
}

// trim writes v with one decimal, none when it is whole.
func trim(v float64) string {
	s := strconv.FormatFloat(v, 'f', 1, 64)
	return strings.TrimSuffix(s, ".0")
}
