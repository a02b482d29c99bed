package adaptive_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/adaptive"
)

func TestProfilesAreValid(t *testing.T) {
	for _, name := range adaptive.ProfileNames() {
		t.Run(name, func(t *testing.T) {
			tuning, err := adaptive.Profile(name)
			if err != nil {
				t.Fatalf("Profile(%q): %v", name, err)
			}
			if err := tuning.Validate(); err != nil {
				t.Fatalf("profile %q is invalid: %v", name, err)
			}
			if _, err := adaptive.NewMode(tuning.ModeConfig()); err != nil {
				t.Fatalf("profile %q cannot build a Mode: %v", name, err)
			}
		})
	}
}

func TestProfileByName(t *testing.T) {
	tests := []struct {
		name string
		want adaptive.Tuning
	}{
		{"default", adaptive.Default()},
		{"low-latency", adaptive.LowLatency()},
		{"high-throughput", adaptive.HighThroughput()},
		{"relaxed", adaptive.Relaxed()},
		{"  Low-Latency ", adaptive.LowLatency()},
		{"HIGH-THROUGHPUT", adaptive.HighThroughput()},
	}
	for _, tt := range tests {
		got, err := adaptive.Profile(tt.name)
		if err != nil {
			t.Fatalf("Profile(%q): %v", tt.name, err)
		}
		if got != tt.want {
			t.Fatalf("Profile(%q) = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestProfileUnknownName(t *testing.T) {
	for _, name := range []string{"", "fast", "low_latency", "defaults"} {
		_, err := adaptive.Profile(name)
		if !errors.Is(err, adaptive.ErrUnknownProfile) {
			t.Fatalf("Profile(%q) error %v does not match ErrUnknownProfile", name, err)
		}
		for _, allowed := range adaptive.ProfileNames() {
			if !strings.Contains(err.Error(), allowed) {
				t.Fatalf("error %q does not list allowed name %q", err, allowed)
			}
		}
	}
}

func TestProfilesDiffer(t *testing.T) {
	def, ll, ht, rx := adaptive.Default(), adaptive.LowLatency(), adaptive.HighThroughput(), adaptive.Relaxed()
	if !(ll.Pacing.ActiveInterval < def.Pacing.ActiveInterval && ll.Pacing.IdleInterval < def.Pacing.IdleInterval) {
		t.Error("low-latency must poll faster than default")
	}
	if !(ht.BatchSize > def.BatchSize && ht.MaxConcurrentPartitions > def.MaxConcurrentPartitions) {
		t.Error("high-throughput must use bigger batches and a wider bulkhead than default")
	}
	if !(rx.Pacing.IdleInterval > def.Pacing.IdleInterval && rx.BackoffBase > def.BackoffBase && rx.DegradeAfter == 1) {
		t.Error("relaxed must poll less, back off longer and degrade at once")
	}
}

// The low-latency profile must allow delivery within 25 ms at 1,000 msg/s,
// even when a partition has just gone idle and no poke arrives: the worst-case
// wait before the next poll is IdleInterval, and a sustained backlog of
// 1,000 msg/s must be drained faster than it arrives by a single partition.
func TestLowLatencyProfileBudget(t *testing.T) {
	ll := adaptive.LowLatency()
	const budget = 25 * time.Millisecond
	const queryAllowance = 10 * time.Millisecond // room for the poll query and handler
	if worst := ll.Pacing.IdleInterval; worst+queryAllowance > budget {
		t.Fatalf("idle safety-net poll %v leaves no room for a %v query within %v", worst, queryAllowance, budget)
	}
	if ll.Pacing.ActiveInterval > 5*time.Millisecond || ll.Pacing.MinInterval > 2*time.Millisecond {
		t.Fatalf("busy pace too slow: active %v, min %v", ll.Pacing.ActiveInterval, ll.Pacing.MinInterval)
	}
	// Capacity of one partition at the slowest busy pace (ActiveInterval):
	perSecond := float64(ll.BatchSize) / ll.Pacing.ActiveInterval.Seconds()
	if perSecond < 2*1000 {
		t.Fatalf("one partition drains only %.0f msg/s at the active pace; want at least twice 1000", perSecond)
	}
}

func TestTuningValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*adaptive.Tuning)
		field  string
	}{
		{"zero batch", func(t *adaptive.Tuning) { t.BatchSize = 0 }, "BatchSize"},
		{"negative batch", func(t *adaptive.Tuning) { t.BatchSize = -10 }, "BatchSize"},
		{"zero degrade threshold", func(t *adaptive.Tuning) { t.DegradeAfter = 0 }, "DegradeAfter"},
		{"zero backoff base", func(t *adaptive.Tuning) { t.BackoffBase = 0 }, "BackoffBase"},
		{"max below base", func(t *adaptive.Tuning) { t.BackoffMax = t.BackoffBase - 1 }, "BackoffMax"},
		{"negative min interval", func(t *adaptive.Tuning) { t.Pacing.MinInterval = -1 }, "Pacing.MinInterval"},
		{"min above idle", func(t *adaptive.Tuning) {
			t.Pacing.MinInterval, t.Pacing.ActiveInterval = 2*t.Pacing.IdleInterval, 2*t.Pacing.IdleInterval
		}, "Pacing.IdleInterval"},
		{"active below min", func(t *adaptive.Tuning) { t.Pacing.ActiveInterval = t.Pacing.MinInterval - 1 }, "Pacing.ActiveInterval"},
		{"zero idle", func(t *adaptive.Tuning) { t.Pacing.IdleInterval = 0 }, "Pacing.IdleInterval"},
		{"negative ramp", func(t *adaptive.Tuning) { t.Pacing.RampStep = -1 }, "Pacing.RampStep"},
		{"zero lease", func(t *adaptive.Tuning) { t.LeaseTTL = 0 }, "LeaseTTL"},
		{"zero renew", func(t *adaptive.Tuning) { t.RenewInterval = 0 }, "RenewInterval"},
		{"renew equals lease", func(t *adaptive.Tuning) { t.RenewInterval = t.LeaseTTL }, "RenewInterval"},
		{"renew above lease", func(t *adaptive.Tuning) { t.RenewInterval = 2 * t.LeaseTTL }, "RenewInterval"},
		{"zero bulkhead", func(t *adaptive.Tuning) { t.MaxConcurrentPartitions = 0 }, "MaxConcurrentPartitions"},
		{"negative sequencer interval", func(t *adaptive.Tuning) { t.SequencerInterval = -time.Millisecond }, "SequencerInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tuning := adaptive.Default()
			tt.mutate(&tuning)
			requireConfigError(t, tuning.Validate(), tt.field)
		})
	}
}

func TestConfigErrorMessage(t *testing.T) {
	tuning := adaptive.Default()
	tuning.RenewInterval = time.Minute
	err := tuning.Validate()
	const want = "outbox: invalid configuration: RenewInterval: must be < LeaseTTL (30s), got 1m0s" // one ConfigError, one format, module-wide
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want %q", err, want)
	}
}

func TestTuningModeConfig(t *testing.T) {
	tuning := adaptive.Relaxed()
	got := tuning.ModeConfig()
	want := adaptive.ModeConfig{BatchSize: 10, DegradeAfter: 1, BackoffBase: 5 * time.Second, BackoffMax: 5 * time.Minute}
	if got != want {
		t.Fatalf("ModeConfig = %+v, want %+v", got, want)
	}
}
