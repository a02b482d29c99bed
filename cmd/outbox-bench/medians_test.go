package main

import "testing"

// The same target of several runs is one row of medians.md, whichever peer
// was the best in each run.
func TestStableNameDropsWhatDiffersFromRunToRun(t *testing.T) {
	for in, want := range map[string]string{
		"(c)/best peer steady: end to end, best peer river, 100/tx":                                                                   "(c)/best peer steady: end to end, best peer, 100/tx",
		"(c)/best peer steady: end to end, best peer peer-tuned, 100/tx":                                                              "(c)/best peer steady: end to end, best peer, 100/tx",
		"CPU per message at 1000 msg/s ÷ best peer's (peer, 781 µs), (c) watermill-outbox → Kafka, adaptive.Default()":                "CPU per message at 1000 msg/s ÷ best peer's, (c) watermill-outbox → Kafka, adaptive.Default()",
		"idle CPU, (c) adaptive.Default() ÷ (b) watermill-sql subscriber":                                                             "idle CPU, (c) adaptive.Default() ÷ (b) watermill-sql subscriber",
		"CPU per message at 1,000 msg/s ÷ the plain INSERT's at that rate (485 µs), (c) watermill-outbox → Kafka, adaptive.Default()": "CPU per message at 1,000 msg/s ÷ the plain INSERT's at that rate, (c) watermill-outbox → Kafka, adaptive.Default()",
	} {
		if got := stableName(in); got != want {
			t.Errorf("stableName(%q) = %q, want %q", in, got, want)
		}
	}
}
