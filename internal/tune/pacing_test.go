package tune_test

import (
	"math"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/tune"
)

func TestPacingProceedDelayRampsDownToMin(t *testing.T) {
	const ms = time.Millisecond
	p := tune.Pacing{MinInterval: 10 * ms, ActiveInterval: 50 * ms, RampStep: 10 * ms, IdleInterval: time.Second}
	want := []time.Duration{50 * ms, 40 * ms, 30 * ms, 20 * ms, 10 * ms, 10 * ms, 10 * ms}
	for i, w := range want {
		if got := p.ProceedDelay(i + 1); got != w {
			t.Fatalf("ProceedDelay(%d) = %v, want %v", i+1, got, w)
		}
	}
}

func TestPacingProceedDelay(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name   string
		p      tune.Pacing
		streak int
		want   time.Duration
	}{
		{"first proceed uses active", tune.Pacing{MinInterval: ms, ActiveInterval: 20 * ms, RampStep: 2 * ms}, 1, 20 * ms},
		{"streak below one treated as first", tune.Pacing{MinInterval: ms, ActiveInterval: 20 * ms, RampStep: 2 * ms}, 0, 20 * ms},
		{"negative streak treated as first", tune.Pacing{MinInterval: ms, ActiveInterval: 20 * ms, RampStep: 2 * ms}, -5, 20 * ms},
		{"step does not divide the range", tune.Pacing{MinInterval: 15 * ms, ActiveInterval: 50 * ms, RampStep: 10 * ms}, 4, 20 * ms},
		{"never below min when step overshoots", tune.Pacing{MinInterval: 15 * ms, ActiveInterval: 50 * ms, RampStep: 10 * ms}, 5, 15 * ms},
		{"zero step keeps active pace", tune.Pacing{MinInterval: ms, ActiveInterval: 20 * ms}, 100, 20 * ms},
		{"min equals active", tune.Pacing{MinInterval: 5 * ms, ActiveInterval: 5 * ms, RampStep: ms}, 3, 5 * ms},
		{"all zero means immediately", tune.Pacing{}, 7, 0},
		{"huge streak does not overflow", tune.Pacing{MinInterval: ms, ActiveInterval: time.Hour, RampStep: time.Hour}, math.MaxInt, ms},
		{"huge streak, tiny step", tune.Pacing{MinInterval: 0, ActiveInterval: math.MaxInt64, RampStep: 1}, math.MaxInt, 1},
		{"invalid active below min still honours min", tune.Pacing{MinInterval: 10 * ms, ActiveInterval: 5 * ms}, 1, 10 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.ProceedDelay(tt.streak); got != tt.want {
				t.Fatalf("ProceedDelay(%d) = %v, want %v", tt.streak, got, tt.want)
			}
		})
	}
}

func TestPacingValidate(t *testing.T) {
	const ms = time.Millisecond
	valid := tune.Pacing{MinInterval: ms, ActiveInterval: 10 * ms, RampStep: ms, IdleInterval: time.Second}
	if err := valid.Validate(); err != nil {
		t.Fatalf("valid pacing rejected: %v", err)
	}
	if err := (tune.Pacing{IdleInterval: ms}).Validate(); err != nil {
		t.Fatalf("zero min/active (poll immediately while busy) rejected: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*tune.Pacing)
		field  string
	}{
		{"negative min", func(p *tune.Pacing) { p.MinInterval = -ms }, "MinInterval"},
		{"negative step", func(p *tune.Pacing) { p.RampStep = -ms }, "RampStep"},
		{"zero idle", func(p *tune.Pacing) { p.IdleInterval = 0 }, "IdleInterval"},
		{"active below min", func(p *tune.Pacing) { p.ActiveInterval = 0 }, "ActiveInterval"},
		{"min above idle", func(p *tune.Pacing) { p.MinInterval, p.ActiveInterval = 2*time.Second, 2*time.Second }, "IdleInterval"},
		{"active above idle", func(p *tune.Pacing) { p.ActiveInterval = 2 * time.Second }, "IdleInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := valid
			tt.mutate(&p)
			requireConfigError(t, p.Validate(), tt.field)
		})
	}
}

// The load-following pace: short after a light pass, growing by a share
// of the busy pace per message, capped by it; none without a floor.
func TestFollowLoadGrowsWithTheMessagesOfAPass(t *testing.T) {
	busy := 20 * time.Millisecond
	for _, c := range []struct {
		n    int
		want time.Duration
	}{
		{0, time.Millisecond}, {1, time.Millisecond}, {2, 1500 * time.Microsecond}, {5, 3 * time.Millisecond},
		{21, 11 * time.Millisecond}, {38, 19500 * time.Microsecond}, {39, busy}, {5000, busy}, {math.MaxInt, busy},
	} {
		if got := tune.FollowLoad(busy, c.n); got != c.want {
			t.Errorf("FollowLoad(%v, %d) = %v, want %v", busy, c.n, got, c.want)
		}
	}
	for _, busy := range []time.Duration{0, -time.Millisecond} {
		if got := tune.FollowLoad(busy, 10); got != 0 {
			t.Errorf("FollowLoad(%v, 10) = %v, want 0", busy, got)
		}
	}
	// Monotone in n, for every profile's pace.
	for _, p := range tune.Profiles() {
		prev := time.Duration(0)
		for n := range 200 {
			got := tune.FollowLoad(p.SequencerInterval, n)
			if got < prev || got > p.SequencerInterval {
				t.Fatalf("%s: FollowLoad(%v, %d) = %v after %v", p.Name, p.SequencerInterval, n, got, prev)
			}
			prev = got
		}
	}
}
