package console

import (
	"bytes"
	"html/template"
	"strings"
	"testing"
	"time"
)

// The line goes from the window's start (x 0) to the newest sample (x
// 300), y from the axis' top (0) to zero (100); it breaks where nobody
// sampled (a gap) or the value is unknown, and a lone point is a dot.
func TestChartLine(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	samples := []sample{
		{At: at(0), Lag: 0, Throughput: nil},
		{At: at(30), Lag: 50, Throughput: ptr(4)},
		{At: at(60), Lag: 100, Throughput: ptr(8)},
		{At: at(90), Lag: 80, Throughput: nil}, // e.g. a reset
		{At: at(120), Lag: 75, Throughput: ptr(2)},
	}
	cs := charts("orders", "billing", samples, 2*time.Minute, 40*time.Second)
	byID := map[string]chart{}
	for _, c := range cs {
		byID[c.ID] = c
	}
	if lag := byID["lag"]; lag.D != "M0 100L75 50L150 0L225 20L300 25" || lag.Points != 5 || lag.Max != "100" || lag.Now != "75" {
		t.Errorf("lag chart %+v", lag)
	}
	if tp := byID["throughput"]; tp.D != "M75 60L150 20M300 80h0" || tp.Points != 3 || tp.Max != "10" || tp.Now != "2" {
		t.Errorf("throughput chart %+v", tp)
	}
	// Sampled again after a gap of 50 s (> 40 s): a new subpath.
	gapped := []sample{{At: at(0), Lag: 10}, {At: at(10), Lag: 10}, {At: at(60), Lag: 10}}
	if d := charts("orders", "billing", gapped, time.Minute, 40*time.Second)[0].D; d != "M0 0L50 0M300 0h0" {
		t.Errorf("gapped line %q", d)
	}
	// Nothing sampled yet: no line, a unit axis.
	if c := charts("orders", "billing", nil, time.Minute, time.Second)[0]; c.D != "" || c.Points != 0 || c.Max != "1" || c.Now != "-" {
		t.Errorf("empty chart %+v", c)
	}
	// Older samples than the window start at its left edge, never left of it.
	old := []sample{{At: at(0), Lag: 1}, {At: at(100), Lag: 1}}
	if d := charts("orders", "billing", old, time.Minute, time.Hour)[0].D; d != "M0 0L300 0" {
		t.Errorf("line of a sample older than the window %q", d)
	}
}

func TestAxisNumbers(t *testing.T) {
	for v, want := range map[float64]float64{0: 1, -3: 1, 0.3: 0.5, 1: 1, 1.01: 2, 3: 5, 7: 10, 300: 500, 1000: 1000, 1001: 2000} {
		if got := niceCeil(v); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", v, got, want)
		}
	}
	for v, want := range map[float64]string{0: "0", 2.5: "2.5", 7: "7", 950: "950", 1234: "1.2k", 2e6: "2M", 3.45e9: "3.5G", 0.04: "0"} {
		if got := human(v); got != want {
			t.Errorf("human(%v) = %q, want %q", v, got, want)
		}
	}
	if windowText(10*time.Minute) != "10 min" || windowText(90*time.Second) != "90 s" || windowText(1500*time.Millisecond) != "1.5 s" {
		t.Error("windowText")
	}
}

// Group names come from users: the charts' titles and the tiles' tooltips
// carry them as escaped text, never as markup.
func TestChartsEscapeNames(t *testing.T) {
	tmpl := template.Must(template.New("x").Funcs(template.FuncMap{"state": stateOf}).ParseFS(assets, "templates/charts.html"))
	const hostile = `<script>alert(1)</script>"><img src=x onerror=alert(2)>`
	page := groupPage{Window: "10 min", Every: 1000,
		Charts: charts("orders", hostile, []sample{{At: time.Now(), Lag: 3}}, time.Minute, time.Second)}
	page.Group = hostile
	var b bytes.Buffer
	for _, name := range []string{"charts", "tiles"} {
		if err := tmpl.ExecuteTemplate(&b, name, page); err != nil {
			t.Fatal(err)
		}
	}
	out := b.String()
	if strings.Contains(out, "<script>") || strings.Contains(out, "<img") {
		t.Fatalf("a name is rendered as markup:\n%s", out)
	}
	if !strings.Contains(out, "<title>Lag (messages) of consumer group &lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img src=x onerror=alert(2)&gt; on topic orders, last 1 min</title>") {
		t.Fatalf("the chart's title does not name the group as text:\n%s", out)
	}
	if strings.Count(out, "<svg ") != 3 || !strings.Contains(out, `<path class="line" d="M300 40h0" data-points="1"/>`) || !strings.Contains(out, `<path class="line" d="" data-points="0"/>`) {
		t.Fatalf("three charts with their line expected:\n%s", out)
	}
}
