package tune

import "time"

// Names of the profiles, as adaptive.Profile accepts them.
const (
	NameDefault        = "default"
	NameLowLatency     = "low-latency"
	NameHighThroughput = "high-throughput"
	NameBackground     = "background"
)

// Profile is every value of a tuning profile.
type Profile struct {
	Name string

	// What adaptive.Tuning sets: its values, and the defaults of its zero
	// fields.
	BatchSize   int
	BackoffBase time.Duration
	BackoffMax  time.Duration
	LeaseTTL    time.Duration

	// The defaults of outbox.SubscriberConfig.Advanced.
	PollInterval            time.Duration // Pacing.IdleInterval
	MaxConcurrentPartitions int

	// The profile's own: not settable.
	DegradeAfter      int
	MinInterval       time.Duration // Pacing.MinInterval
	ActiveInterval    time.Duration // Pacing.ActiveInterval
	RampStep          time.Duration // Pacing.RampStep
	SequencerInterval time.Duration // the Subscriber's own sequencer's MinPassInterval
}

// The profiles.
var (
	// Default is the balanced profile: moderate batches, a fast pace while
	// there is a backlog, a one-second safety-net poll while idle and a
	// gentle retry backoff (1 s doubling up to 1 min).
	Default = Profile{
		Name: NameDefault, BatchSize: 50, BackoffBase: time.Second, BackoffMax: time.Minute, LeaseTTL: 30 * time.Second,
		PollInterval: time.Second, MaxConcurrentPartitions: 16,
		DegradeAfter: 2, MinInterval: 5 * time.Millisecond, ActiveInterval: 50 * time.Millisecond, RampStep: 5 * time.Millisecond,
		SequencerInterval: 20 * time.Millisecond,
	}
	// LowLatency is for real-time delivery: polls a few milliseconds apart
	// while busy, a 10 ms safety-net poll while idle, small batches and
	// retries from 100 ms.
	LowLatency = Profile{
		Name: NameLowLatency, BatchSize: 10, BackoffBase: 100 * time.Millisecond, BackoffMax: 10 * time.Second, LeaseTTL: 30 * time.Second,
		PollInterval: 10 * time.Millisecond, MaxConcurrentPartitions: 32,
		DegradeAfter: 3, MinInterval: time.Millisecond, ActiveInterval: 2 * time.Millisecond, RampStep: time.Millisecond,
		SequencerInterval: 2 * time.Millisecond,
	}
	// HighThroughput is for bulk transfer: large batches, a pace that
	// ramps down to 1 ms while a backlog lasts, longer leases and a wide
	// bulkhead.
	HighThroughput = Profile{
		Name: NameHighThroughput, BatchSize: 500, BackoffBase: time.Second, BackoffMax: time.Minute, LeaseTTL: 60 * time.Second,
		PollInterval: time.Second, MaxConcurrentPartitions: 64,
		DegradeAfter: 2, MinInterval: time.Millisecond, ActiveInterval: 20 * time.Millisecond, RampStep: 2 * time.Millisecond,
		SequencerInterval: 20 * time.Millisecond,
	}
	// Background is for background work: a slow pace, a 30 s safety-net
	// poll, degradation on the first failure, a long retry backoff and a
	// narrow bulkhead.
	Background = Profile{
		Name: NameBackground, BatchSize: 10, BackoffBase: 5 * time.Second, BackoffMax: 5 * time.Minute, LeaseTTL: 30 * time.Second,
		PollInterval: 30 * time.Second, MaxConcurrentPartitions: 4,
		DegradeAfter: 1, MinInterval: 100 * time.Millisecond, ActiveInterval: 500 * time.Millisecond, RampStep: 50 * time.Millisecond,
		SequencerInterval: 100 * time.Millisecond,
	}
)

// Profiles are the profiles, in a stable order.
func Profiles() []Profile { return []Profile{Default, LowLatency, HighThroughput, Background} }

// Lookup returns the profile named name ("" is Default).
func Lookup(name string) (Profile, bool) {
	if name == "" {
		return Default, true
	}
	for _, p := range Profiles() {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// Pacing is the profile's pacing.
func (p Profile) Pacing() Pacing {
	return Pacing{MinInterval: p.MinInterval, ActiveInterval: p.ActiveInterval, RampStep: p.RampStep, IdleInterval: p.PollInterval}
}

// Settings are what a subscription's partition workers use: the batch
// sizing, the retry backoff and the pacing, resolved from a profile and
// the knobs set over it.
type Settings struct {
	BatchSize    int
	DegradeAfter int
	BackoffBase  time.Duration
	BackoffMax   time.Duration
	Pacing       Pacing
}

// ModeConfig returns the part of s that configures a [Mode].
func (s Settings) ModeConfig() ModeConfig {
	return ModeConfig{BatchSize: s.BatchSize, DegradeAfter: s.DegradeAfter, BackoffBase: s.BackoffBase, BackoffMax: s.BackoffMax}
}

// Settings resolves the workers' settings of p with the values set over
// it: batch, backoff base and max, and the idle poll. The profile's own
// pacing ramp is kept inside poll: ActiveInterval at most poll,
// MinInterval at most ActiveInterval.
func (p Profile) Settings(batch int, backoffBase, backoffMax, poll time.Duration) Settings {
	active := min(p.ActiveInterval, poll)
	return Settings{
		BatchSize:    batch,
		DegradeAfter: p.DegradeAfter,
		BackoffBase:  backoffBase,
		BackoffMax:   backoffMax,
		Pacing: Pacing{
			MinInterval:    min(p.MinInterval, active),
			ActiveInterval: active,
			RampStep:       p.RampStep,
			IdleInterval:   poll,
		},
	}
}
