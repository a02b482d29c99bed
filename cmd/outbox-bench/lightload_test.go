package main

import (
	"strings"
	"testing"
)

// The latency phase's plain-INSERT run at each load is the ceiling the
// forwarding systems' CPU per message is judged against (issue 40: at
// most 1.5× at 1,000 msg/s); it has no latency to show.
func TestLightLoadJudgesCPUAgainstTheCeilingAtTheSameRate(t *testing.T) {
	res := &results{
		Config: map[string]any{"partitions": 16},
		Latency: []*latencyResult{
			{System: sysCeiling, OfferedRate: 1000, PerTx: 1, Messages: 100, Received: 100, Complete: true, KeptSchedule: true, AchievedRate: 1000,
				CPUMicrosPerMessage: 400, ProcessMicrosPerMessage: 150, PostgresMicrosPerMessage: 250},
			{System: sysOutbox, Tuning: "adaptive.Default()", OfferedRate: 1000, PerTx: 1, Messages: 100, Received: 100, Complete: true, KeptSchedule: true,
				CPUMicrosPerMessage: 500},
			{System: sysOutboxWAL, Tuning: "adaptive.Default()", OfferedRate: 1000, PerTx: 1, Messages: 100, Received: 100, Complete: true, KeptSchedule: true,
				CPUMicrosPerMessage: 900},
		},
	}
	got := map[string]target{}
	for _, tg := range res.lightLoadTargets() {
		if strings.Contains(tg.Name, "plain INSERT's at that rate (400 µs)") {
			got[tg.Name[strings.LastIndex(tg.Name, "), ")+3:]] = tg
		}
	}
	table, wal := got[systemLabel[sysOutbox]+", adaptive.Default()"], got[systemLabel[sysOutboxWAL]+", adaptive.Default()"]
	if table.Measured != 1.25 || !table.Met || wal.Measured != 2.25 || wal.Met || len(got) != 2 {
		t.Fatalf("ceiling targets %+v", got)
	}
	md := res.markdown()
	if want := "| " + systemLabel[sysCeiling] + " | 1000 | 1 | 1000 | 100 committed | — | — | — | — | — | — | — | 400.0 (150.0 + 250.0) |"; !strings.Contains(md, want) {
		t.Fatalf("results.md lacks the ceiling's row %q:\n%s", want, md)
	}
}
