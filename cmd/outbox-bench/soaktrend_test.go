package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The verdicts on made-up series: a noisy level, a line that rises the
// whole run, one that rises and levels off, one that falls.
func TestSoakTrendVerdicts(t *testing.T) {
	var xs []float64
	for i := range 40 {
		xs = append(xs, float64(i)/40) // an hour, a sample every 90 s
	}
	series := func(f func(x float64, i int) float64) []float64 {
		ys := make([]float64, len(xs))
		for i, x := range xs {
			ys[i] = f(x, i)
		}
		return ys
	}
	wiggle := func(i int) float64 { return []float64{-3, 2, 4, -1, -2}[i%5] }
	for _, c := range []struct {
		name string
		ys   []float64
		want string
	}{
		{"level with noise", series(func(_ float64, i int) float64 { return 100 + wiggle(i) }), verdictFlat},
		{"rising", series(func(x float64, i int) float64 { return 100 + 80*x + wiggle(i) }), verdictGrowing},
		{"levelled off", series(func(x float64, i int) float64 { return 100 + 80*math.Min(x, 0.3) + wiggle(i) }), verdictBounded},
		{"falling", series(func(x float64, i int) float64 { return 200 - 100*x + wiggle(i) }), verdictFalling},
	} {
		got := judge(c.name, "ms", 0.5, xs, c.ys)
		if got.Verdict != c.want {
			t.Errorf("%s: verdict %q (slope %.1f/h, noise %.1f); want %q", c.name, got.Verdict, got.SlopePerHour, got.Noise, c.want)
		}
	}
	rising := judge("rising", "ms", 0.5, xs, series(func(x float64, _ int) float64 { return 100 + 80*x }))
	if math.Abs(rising.SlopePerHour-80) > 1e-6 || rising.Noise > 1e-6 {
		t.Errorf("a straight line 100 + 80/h: slope %v, noise %v", rising.SlopePerHour, rising.Noise)
	}
	if got := judge("short", "", 1, xs[:5], xs[:5]); got.Verdict != verdictTooShort {
		t.Errorf("five samples: %q", got.Verdict)
	}
}

// The warm-up is left out of the trends, and results.md has the table and
// the samples.
func TestSoakRendersTrendsAfterTheWarmup(t *testing.T) {
	s := &soakResult{Rate: 1000, PerTx: 1, Publishers: 8, Partitions: 16, DurationSeconds: 3600, IntervalSeconds: 30,
		WarmupSeconds: soakWarmup(time.Hour).Seconds(), KeepForSeconds: 60, Naptime: "1m0s"}
	for i := range 120 {
		p99 := 20.0
		if i < 10 { // the first 5 minutes: warming up
			p99 = 200
		}
		s.Samples = append(s.Samples, soakSample{Seconds: float64(30 * (i + 1)), P99Ms: p99, Connections: 15,
			Tables: []tableSample{{Name: "pending", Bytes: 1 << 20, DeadRows: 500}, {Name: "log", Bytes: 30 << 20}}})
	}
	s.Trends = s.trends()
	var p99 *trend
	for i := range s.Trends {
		if s.Trends[i].Metric == "commit→broker p99" {
			p99 = &s.Trends[i]
		}
	}
	if p99 == nil || p99.Verdict != verdictFlat || p99.First != 20 {
		t.Fatalf("p99 trend %+v; want flat at 20 (the warm-up left out)", p99)
	}
	res := &results{Soak: s}
	md := res.markdown()
	for _, want := range []string{
		"## Soak: 1000 msg/s for 1h, retention on",
		"| pending: size on disk | 1.00 MiB | 1.00 MiB | 1.00 MiB | +0.00 MiB/h | 0.00 | flat |",
		"| 3600 | 0 | 0.0 | 20.0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	if _, err := soakImage(s); err != nil {
		t.Errorf("soak.png: %v", err)
	}
}
