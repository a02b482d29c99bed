package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-phases", "growth,compare", "-systems", "outbox", "-latency-loads", "10000,1000,1000"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.phases, []string{phaseCompare, phaseGrowth}) || !slices.Equal(cfg.systems, []string{sysOutbox}) {
		t.Errorf("phases %v, systems %v", cfg.phases, cfg.systems)
	}
	if !slices.Equal(cfg.latencyLoads, []int{10000, 1000}) {
		t.Errorf("latency loads %v", cfg.latencyLoads)
	}

	cfg, err = parseFlags([]string{"-smoke", "-phases", "latency"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.messages != 2000 || cfg.latencyDuration != 2*time.Second || cfg.growthHistory != 20000 || !slices.Equal(cfg.phases, []string{phaseLatency}) {
		t.Errorf("smoke config %+v", cfg)
	}

	for _, bad := range [][]string{
		{"-phases", "compare,speed"},
		{"-systems", ""},
		{"-per-tx", "0"},
		{"-latency-loads", "1", "-latency-duration", "10ms"},
		{"-growth-partitions", "2000"},
		{"-growth-history", "5"},
		{"-partitions", "0"},
		{"leftover"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestPercentiles(t *testing.T) {
	var lat []int64
	for i := 1; i <= 1000; i++ {
		lat = append(lat, int64(i)*int64(time.Millisecond))
	}
	s := summarize(lat)
	if s.Count != 1000 || s.P50Ms != 500 || s.P99Ms != 990 || s.P999Ms != 999 || s.MaxMs != 1000 {
		t.Errorf("summary %+v", s)
	}
	c := cdf(lat)
	if c[0].Frac != 0 || c[0].Ms != 1 || c[len(c)-1].Frac != 1 || c[len(c)-1].Ms != 1000 {
		t.Errorf("cdf ends %+v … %+v", c[0], c[len(c)-1])
	}
	if summarize(nil).P99Ms != 0 || cdf(nil) != nil {
		t.Error("empty input")
	}
}

func TestLatencyTxs(t *testing.T) {
	for _, tc := range []struct {
		load int
		d    time.Duration
		want int
	}{
		{1000, 20 * time.Second, 20000},  // 1/tx
		{10000, 20 * time.Second, 20000}, // 10/tx
		{200, 2 * time.Second, 400},
		{2500, time.Second, 1250}, // 2/tx
	} {
		if got := latencyTxs(tc.load, tc.d); got != tc.want {
			t.Errorf("latencyTxs(%d, %v) = %d, want %d", tc.load, tc.d, got, tc.want)
		}
	}
}

func TestAxes(t *testing.T) {
	if a := linAxis(1300, ""); a.max != 2000 || len(a.ticks) != 5 || a.ticks[1] != 500 {
		t.Errorf("linAxis(1300) = %+v", a)
	}
	if a := linAxis(4200, ""); a.max != 5000 || len(a.ticks) != 6 {
		t.Errorf("linAxis(4200) = %+v", a)
	}
	if a := logAxis(0.3, 107, ""); a.min != 0.1 || a.max != 1000 || len(a.ticks) != 5 || a.frac(10) != 0.5 {
		t.Errorf("logAxis(0.3, 107) = %+v", a)
	}
	for v, want := range map[float64]string{0: "0", 0.25: "0.25", 625: "625", 1000: "1K", 1250: "1250", 20000: "20K", 2.5e6: "2.5M"} {
		if got := fmtNum(v); got != want {
			t.Errorf("fmtNum(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestSummarizeRounds(t *testing.T) {
	rounds := []*publishRound{
		{System: sysCeiling, PerTx: 100, Round: 1, Rate: 100, CPUMicrosPerMessage: 10},
		{System: sysOutbox, PerTx: 100, Round: 1, Rate: 90, CPUMicrosPerMessage: 20},
		{System: sysCeiling, PerTx: 100, Round: 2, Rate: 200, CPUMicrosPerMessage: 10},
		{System: sysOutbox, PerTx: 100, Round: 2, Rate: 100, CPUMicrosPerMessage: 20},
		{System: sysCeiling, PerTx: 100, Round: 3, Rate: 150, CPUMicrosPerMessage: 10},
		{System: sysOutbox, PerTx: 100, Round: 3, Rate: 120, CPUMicrosPerMessage: 20},
	}
	got := summarizeRounds(rounds, []int{100})
	if len(got) != 2 {
		t.Fatalf("%d summaries, want 2", len(got))
	}
	a, c := got[0], got[1]
	if a.System != sysCeiling || a.MedianRate != 150 || a.MinRate != 100 || a.MaxRate != 200 {
		t.Fatalf("(a) summary %+v", a)
	}
	if c.System != sysOutbox || c.MedianRate != 100 || c.RatioToA != 100.0/150 || c.CPURatioToA != 0.5 {
		t.Fatalf("(c) summary %+v", c)
	}
	want := []float64{0.5, 0.8, 0.9}
	if len(c.RatioOfRounds) != 3 || c.RatioOfRounds[0] != want[0] || c.RatioOfRounds[1] != want[1] || c.RatioOfRounds[2] != want[2] {
		t.Fatalf("per-round ratios %v, want %v", c.RatioOfRounds, want)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Fatalf("median of an even count = %v, want 2.5", m)
	}
}

func TestRewriteRendersTheSameTables(t *testing.T) {
	dir := t.TempDir()
	res := &results{
		Config: map[string]any{"publish_rounds": 1, "publishers": 4},
		PublishRounds: []*publishRound{
			{System: sysCeiling, PerTx: 100, Round: 1, Messages: 100, Rate: 100, CPUMicrosPerMessage: 10},
			{System: sysOutbox, PerTx: 100, Round: 1, Messages: 100, Rate: 90, CPUMicrosPerMessage: 11},
		},
	}
	res.PublishSummary = summarizeRounds(res.PublishRounds, []int{100})
	if err := res.write(dir); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "results.md")); err != nil {
		t.Fatal(err)
	}
	if err := rewrite(dir); err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(before) != string(after) || !strings.Contains(string(after), "**0.90×**") {
		t.Fatalf("rewritten results.md differs or lacks the ratio:\n%s\n---\n%s", before, after)
	}
}
