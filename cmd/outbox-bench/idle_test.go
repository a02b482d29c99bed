package main

import (
	"strings"
	"testing"
	"time"
)

func TestIdleAndCPUSplitRender(t *testing.T) {
	res := &results{
		Config: map[string]any{"partitions": 16},
		Latency: []*latencyResult{{System: sysOutbox, Tuning: "adaptive.Default()", OfferedRate: 1000, PerTx: 1,
			CPUMicrosPerMessage: 900, ProcessMicrosPerMessage: 400, PostgresMicrosPerMessage: 500}},
		Idle: []*idleResult{
			{System: sysPeer, Seconds: 20, ProcessMillisPerSecond: 3, PostgresMillisPerSecond: 4.5},
			{System: sysOutbox, Tuning: "adaptive.Default()", Seconds: 20, ProcessMillisPerSecond: 2, PostgresMillisPerSecond: 1.25},
		},
	}
	md := res.markdown()
	for _, want := range []string{
		"| 900.0 (400.0 + 500.0) |",
		"## Idle: the relay with nothing to relay",
		"| " + systemLabel[sysPeer] + " | 20 | 7.5 (3.0 + 4.5) |",
		"| " + systemLabel[sysOutbox] + ", adaptive.Default() | 20 | 3.2 (2.0 + 1.2) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	// Results written before the split render their total alone.
	if got := cpuSplit(900, 0, 0); got != "900.0" {
		t.Errorf("cpuSplit without a split = %q", got)
	}
}

func TestIdlePhaseFlags(t *testing.T) {
	cfg, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.has(phaseIdle) || cfg.idleDuration != 20*time.Second {
		t.Errorf("the default run has no idle phase of 20 s: phases %v, idle %v", cfg.phases, cfg.idleDuration)
	}
	cfg, err = parseFlags([]string{"-smoke"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.idleDuration != 2*time.Second {
		t.Errorf("smoke idle duration %v", cfg.idleDuration)
	}
	if _, err := parseFlags([]string{"-idle-duration", "0s"}); err == nil {
		t.Error("-idle-duration 0s: no error")
	}
}
