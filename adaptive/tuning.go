package adaptive

import (
	"fmt"
	"strings"
	"time"
)

// Names accepted by [Profile].
const (
	ProfileDefault        = "default"
	ProfileLowLatency     = "low-latency"
	ProfileHighThroughput = "high-throughput"
	ProfileRelaxed        = "relaxed"
)

// Tuning bundles the knobs of a subscriber's partition workers. Start from a
// profile ([Default], [LowLatency], [HighThroughput], [Relaxed]) and adjust
// fields as needed, then call [Tuning.Validate].
type Tuning struct {
	// BatchSize is the number of messages read per batch in Normal state.
	// Must be >= 1.
	BatchSize int
	// DegradeAfter is how many consecutive failed batches shrink the batch
	// size. Must be >= 1.
	DegradeAfter int
	// BackoffBase is the retry delay after the first failed batch. Must be
	// > 0.
	BackoffBase time.Duration
	// BackoffMax caps the retry delay. Must be >= BackoffBase.
	BackoffMax time.Duration
	// Pacing sets the waits between polls.
	Pacing Pacing
	// LeaseTTL is how long a worker's claim on a partition stays valid
	// without renewal. Must be > 0.
	LeaseTTL time.Duration
	// RenewInterval is how often a worker renews its lease. Must be > 0 and
	// < LeaseTTL.
	RenewInterval time.Duration
	// MaxConcurrentPartitions is the bulkhead size: how many partition
	// workers may query the database at the same time. Must be >= 1.
	MaxConcurrentPartitions int
	// SequencerInterval paces the sequencer a subscriber runs while
	// messages keep coming (its MinPassInterval; 0: the sequencer's
	// default). Each pass wakes the workers of the partitions it filled,
	// so this interval sets the batch sizes of a steady stream: shorter
	// cuts latency, longer cuts the database work per message. Must be
	// >= 0.
	SequencerInterval time.Duration
}

// Validate returns nil if t is usable, and otherwise a [*ConfigError]
// describing the first problem found.
func (t Tuning) Validate() error {
	if err := t.ModeConfig().Validate(); err != nil {
		return err
	}
	if err := t.Pacing.validate("Pacing."); err != nil {
		return err
	}
	switch {
	case t.LeaseTTL <= 0:
		return configErrorf("LeaseTTL", "must be > 0, got %v", t.LeaseTTL)
	case t.RenewInterval <= 0:
		return configErrorf("RenewInterval", "must be > 0, got %v", t.RenewInterval)
	case t.RenewInterval >= t.LeaseTTL:
		return configErrorf("RenewInterval", "must be < LeaseTTL (%v), got %v", t.LeaseTTL, t.RenewInterval)
	case t.MaxConcurrentPartitions < 1:
		return configErrorf("MaxConcurrentPartitions", "must be >= 1, got %d", t.MaxConcurrentPartitions)
	case t.SequencerInterval < 0:
		return configErrorf("SequencerInterval", "must be >= 0, got %v", t.SequencerInterval)
	}
	return nil
}

// ModeConfig returns the part of t that configures a [Mode].
func (t Tuning) ModeConfig() ModeConfig {
	return ModeConfig{
		BatchSize:    t.BatchSize,
		DegradeAfter: t.DegradeAfter,
		BackoffBase:  t.BackoffBase,
		BackoffMax:   t.BackoffMax,
	}
}

// Default returns the balanced profile: moderate batches, a fast pace while
// there is a backlog, a one-second safety-net poll while idle and a gentle
// retry backoff (1 s doubling up to 1 min).
func Default() Tuning {
	return Tuning{
		BatchSize:    50,
		DegradeAfter: 2,
		BackoffBase:  time.Second,
		BackoffMax:   time.Minute,
		Pacing: Pacing{
			MinInterval:    5 * time.Millisecond,
			ActiveInterval: 50 * time.Millisecond,
			RampStep:       5 * time.Millisecond,
			IdleInterval:   time.Second,
		},
		LeaseTTL:                30 * time.Second,
		RenewInterval:           10 * time.Second,
		MaxConcurrentPartitions: 16,
		SequencerInterval:       20 * time.Millisecond,
	}
}

// LowLatency returns a profile for real-time delivery (notifications, chat):
// polls a few milliseconds apart while busy and a 10 ms safety-net poll while
// idle, so a message is picked up well within 25 ms even without pokes, at
// the cost of steady polling. Batches stay small and retries start at
// 100 ms. With a poke source (e.g. LISTEN/NOTIFY), IdleInterval can be
// raised to cut idle polling without hurting latency.
func LowLatency() Tuning {
	return Tuning{
		BatchSize:    10,
		DegradeAfter: 3,
		BackoffBase:  100 * time.Millisecond,
		BackoffMax:   10 * time.Second,
		Pacing: Pacing{
			MinInterval:    time.Millisecond,
			ActiveInterval: 2 * time.Millisecond,
			RampStep:       time.Millisecond,
			IdleInterval:   10 * time.Millisecond,
		},
		LeaseTTL:                30 * time.Second,
		RenewInterval:           10 * time.Second,
		MaxConcurrentPartitions: 32,
		SequencerInterval:       2 * time.Millisecond,
	}
}

// HighThroughput returns a profile for bulk transfer (ETL, analytics): large
// batches, a pace that quickly ramps down to 1 ms while a backlog lasts,
// longer leases for long batches and a wide bulkhead.
func HighThroughput() Tuning {
	return Tuning{
		BatchSize:    500,
		DegradeAfter: 2,
		BackoffBase:  time.Second,
		BackoffMax:   time.Minute,
		Pacing: Pacing{
			MinInterval:    time.Millisecond,
			ActiveInterval: 20 * time.Millisecond,
			RampStep:       2 * time.Millisecond,
			IdleInterval:   time.Second,
		},
		LeaseTTL:                60 * time.Second,
		RenewInterval:           20 * time.Second,
		MaxConcurrentPartitions: 64,
		SequencerInterval:       20 * time.Millisecond,
	}
}

// Relaxed returns a profile for background work where latency hardly
// matters (digests, housekeeping): a slow pace, a 30 s safety-net poll,
// degradation on the first failure, a long retry backoff (5 s up to 5 min)
// and a narrow bulkhead that keeps database load low.
func Relaxed() Tuning {
	return Tuning{
		BatchSize:    10,
		DegradeAfter: 1,
		BackoffBase:  5 * time.Second,
		BackoffMax:   5 * time.Minute,
		Pacing: Pacing{
			MinInterval:    100 * time.Millisecond,
			ActiveInterval: 500 * time.Millisecond,
			RampStep:       50 * time.Millisecond,
			IdleInterval:   30 * time.Second,
		},
		LeaseTTL:                30 * time.Second,
		RenewInterval:           10 * time.Second,
		MaxConcurrentPartitions: 4,
		SequencerInterval:       100 * time.Millisecond,
	}
}

// ProfileNames returns the names [Profile] accepts, in a stable order.
func ProfileNames() []string {
	return []string{ProfileDefault, ProfileLowLatency, ProfileHighThroughput, ProfileRelaxed}
}

// Profile returns the tuning profile with the given name: "default",
// "low-latency", "high-throughput" or "relaxed" (case and surrounding spaces
// are ignored). Any other name yields an error matching [ErrUnknownProfile].
func Profile(name string) (Tuning, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case ProfileDefault:
		return Default(), nil
	case ProfileLowLatency:
		return LowLatency(), nil
	case ProfileHighThroughput:
		return HighThroughput(), nil
	case ProfileRelaxed:
		return Relaxed(), nil
	}
	return Tuning{}, fmt.Errorf("%w %q (allowed: %s)", ErrUnknownProfile, name, strings.Join(ProfileNames(), ", "))
}
