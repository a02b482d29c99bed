package console

import (
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/admin"
)

// Each partition takes the most pressing state that applies, its label
// lists them all; "ok" needs everything to say so, and a state the console
// does not know is never "ok".
func TestPartitionStates(t *testing.T) {
	now := time.Now()
	healthy := admin.PartitionStatus{Leased: true, AdaptiveState: "normal"}
	with := func(edit func(*admin.PartitionStatus)) admin.PartitionStatus {
		p := healthy
		edit(&p)
		return p
	}
	for _, tc := range []struct {
		name         string
		p            admin.PartitionStatus
		class, label string
	}{
		{"healthy", healthy, "ok", "ok"},
		{"no lease", with(func(p *admin.PartitionStatus) { p.Leased = false }), "no-lease", "no lease"},
		{"zero status", admin.PartitionStatus{}, "no-lease", `no lease, batching state "" unknown to this console`},
		{"paused (no lease is expected)", with(func(p *admin.PartitionStatus) { p.Paused, p.Leased = true, false }), "paused", "paused"},
		{"backing off", with(func(p *admin.PartitionStatus) { p.BackingOff, p.Attempts = true, 3 }), "backing-off", "backing-off"},
		{"failing, retry due", with(func(p *admin.PartitionStatus) { p.Attempts = 2 }), "failing", "failing (2 attempts)"},
		{"unanswered", with(func(p *admin.PartitionStatus) { p.Leased, p.Unanswered = false, 1 }), "no-lease", "no lease, unanswered delivery"},
		{"held keys", with(func(p *admin.PartitionStatus) { p.HeldKeys = []admin.HeldKey{{Key: "a"}, {Key: "b"}} }), "held", "2 keys held"},
		{"isolation full", with(func(p *admin.PartitionStatus) { p.HeldKeys, p.IsolationFullSince = []admin.HeldKey{{Key: "a"}}, &now }), "held", "1 keys held, isolation-full"},
		{"degraded", with(func(p *admin.PartitionStatus) { p.AdaptiveState = "degraded" }), "degraded", "degraded"},
		{"unknown batching state", with(func(p *admin.PartitionStatus) { p.AdaptiveState = "turbo" }), "unknown", `batching state "turbo" unknown to this console`},
		{"empty batching state", with(func(p *admin.PartitionStatus) { p.AdaptiveState = "" }), "unknown", `batching state "" unknown to this console`},
		{"everything", with(func(p *admin.PartitionStatus) {
			p.Paused, p.BackingOff, p.HeldKeys, p.AdaptiveState = true, true, []admin.HeldKey{{}}, "degraded"
		}), "paused", "paused, backing-off, 1 keys held, degraded"},
		{"backing off and degraded", with(func(p *admin.PartitionStatus) { p.BackingOff, p.AdaptiveState = true, "degraded" }), "backing-off", "backing-off, degraded"},
	} {
		if got := stateOf(tc.p); got.Class != tc.class || got.Label != tc.label {
			t.Errorf("%s: %+v, want class %q label %q", tc.name, got, tc.class, tc.label)
		}
	}
}

// The legend lists every state in order of pressure, with its count.
func TestLegendCountsEveryState(t *testing.T) {
	parts := []admin.PartitionStatus{
		{Leased: true, AdaptiveState: "normal"}, {Leased: true, AdaptiveState: "normal"},
		{Paused: true, AdaptiveState: "normal"}, {AdaptiveState: "normal"}, {Leased: true, AdaptiveState: "?"},
	}
	got := legend(parts)
	if len(got) != len(stateClasses) || got[0].Class != "paused" || got[len(got)-1].Class != "ok" {
		t.Fatalf("legend %+v", got)
	}
	counts := map[string]int{}
	for _, e := range got {
		counts[e.Class] = e.Count
	}
	if counts["ok"] != 2 || counts["paused"] != 1 || counts["no-lease"] != 1 || counts["unknown"] != 1 || counts["failing"] != 0 {
		t.Fatalf("counts %v", counts)
	}
}
