package tune_test

import (
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/tune"
)

// Every profile resolves to settings a Mode and a worker accept.
func TestProfilesResolveToValidSettings(t *testing.T) {
	for _, p := range tune.Profiles() {
		s := p.Settings(p.BatchSize, p.BackoffBase, p.BackoffMax, p.PollInterval)
		if _, err := tune.NewMode(s.ModeConfig()); err != nil {
			t.Errorf("%s: %v", p.Name, err)
		}
		if err := s.Pacing.Validate(); err != nil {
			t.Errorf("%s: %v", p.Name, err)
		}
		if want := p.Pacing(); s.Pacing != want {
			t.Errorf("%s: pacing %+v, want the profile's %+v", p.Name, s.Pacing, want)
		}
		if got, ok := tune.Lookup(p.Name); !ok || got != p {
			t.Errorf("Lookup(%q) = %+v, %v", p.Name, got, ok)
		}
	}
	if p, ok := tune.Lookup(""); !ok || p != tune.Default {
		t.Errorf(`Lookup("") = %+v, %v; want Default`, p, ok)
	}
	if _, ok := tune.Lookup("turbo"); ok {
		t.Error(`Lookup("turbo") found a profile`)
	}
}

// An idle poll set below the profile's busy pace pulls the ramp down with
// it, so that any poll interval gives a valid pacing.
func TestSettingsKeepTheRampWithinThePoll(t *testing.T) {
	const ms = time.Millisecond
	s := tune.Background.Settings(10, time.Second, time.Minute, 200*ms) // Background: min 100 ms, active 500 ms
	if s.Pacing.ActiveInterval != 200*ms || s.Pacing.MinInterval != 100*ms || s.Pacing.IdleInterval != 200*ms {
		t.Fatalf("pacing %+v: want active 200ms, min 100ms, idle 200ms", s.Pacing)
	}
	s = tune.Background.Settings(10, time.Second, time.Minute, 50*ms)
	if s.Pacing.ActiveInterval != 50*ms || s.Pacing.MinInterval != 50*ms {
		t.Fatalf("pacing %+v: want active and min 50ms", s.Pacing)
	}
	if err := s.Pacing.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestSettingsModeConfig(t *testing.T) {
	got := tune.Background.Settings(10, 5*time.Second, 5*time.Minute, 30*time.Second).ModeConfig()
	want := tune.ModeConfig{BatchSize: 10, DegradeAfter: 1, BackoffBase: 5 * time.Second, BackoffMax: 5 * time.Minute}
	if got != want {
		t.Fatalf("ModeConfig = %+v, want %+v", got, want)
	}
}

func TestProfilesDiffer(t *testing.T) {
	def, ll, ht, rx := tune.Default, tune.LowLatency, tune.HighThroughput, tune.Background
	if !(ll.ActiveInterval < def.ActiveInterval && ll.PollInterval < def.PollInterval && ll.SequencerInterval < def.SequencerInterval) {
		t.Error("low-latency must poll and sequence faster than default")
	}
	if !(ht.BatchSize > def.BatchSize && ht.MaxConcurrentPartitions > def.MaxConcurrentPartitions) {
		t.Error("high-throughput must use bigger batches and a wider bulkhead than default")
	}
	if !(rx.PollInterval > def.PollInterval && rx.BackoffBase > def.BackoffBase && rx.DegradeAfter == 1) {
		t.Error("relaxed must poll less, back off longer and degrade at once")
	}
}

// The low-latency profile must allow delivery within 25 ms at 1,000 msg/s,
// even when a partition has just gone idle and no poke arrives: the worst-case
// wait before the next poll is IdleInterval, and a sustained backlog of
// 1,000 msg/s must be drained faster than it arrives by a single partition.
func TestLowLatencyProfileBudget(t *testing.T) {
	ll := tune.LowLatency
	const budget = 25 * time.Millisecond
	const queryAllowance = 10 * time.Millisecond // room for the poll query and handler
	if worst := ll.PollInterval; worst+queryAllowance > budget {
		t.Fatalf("idle safety-net poll %v leaves no room for a %v query within %v", worst, queryAllowance, budget)
	}
	if ll.ActiveInterval > 5*time.Millisecond || ll.MinInterval > 2*time.Millisecond {
		t.Fatalf("busy pace too slow: active %v, min %v", ll.ActiveInterval, ll.MinInterval)
	}
	// Capacity of one partition at the slowest busy pace (ActiveInterval):
	perSecond := float64(ll.BatchSize) / ll.ActiveInterval.Seconds()
	if perSecond < 2*1000 {
		t.Fatalf("one partition drains only %.0f msg/s at the active pace; want at least twice 1000", perSecond)
	}
}
