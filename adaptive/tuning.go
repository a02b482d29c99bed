package adaptive

import (
	"fmt"
	"strings"
	"time"

	"github.com/millrace/watermill-outbox/internal/tune"
)

// minLeaseTTL is the shortest LeaseTTL the lease manager works with.
const minLeaseTTL = 100 * time.Millisecond

// Tuning is the part of a subscriber's configuration a profile sets. Start
// from a profile ([Default], [LowLatency], [HighThroughput], [Background]) and
// change the fields you need, or set only those on a zero Tuning: a zero
// field takes its profile's value ([Default]'s for a Tuning made by hand),
// field by field, so setting one field never invalidates the others.
//
// A profile also chooses values no field shows: how soon a failing batch
// shrinks, the ramp of the poll pace while a backlog lasts, and the pace
// of the subscriber's own sequencer; and the defaults of
// outbox.SubscriberConfig.Advanced (the idle poll and the bulkhead).
// docs/operations.md lists every profile's values.
type Tuning struct {
	// BatchSize is the number of messages read per batch (while nothing
	// fails). Must be >= 1.
	BatchSize int
	// BackoffBase is the retry delay after the first failed batch (or
	// failed delivery of a held key); it doubles with each further failure
	// in a row. Must be > 0.
	BackoffBase time.Duration
	// BackoffMax caps the retry delay. Must be >= BackoffBase; when only
	// BackoffBase is set, it is at least BackoffBase.
	BackoffMax time.Duration
	// LeaseTTL is how long a partition's lease, and a member's heartbeat,
	// stay valid without renewal: the fail-over time after a crash. Leases
	// are renewed every LeaseTTL/5; the subscriber's HandlerTimeout
	// defaults to 2/3 of it. Must be >= 100ms.
	LeaseTTL time.Duration

	// profile names the profile the zero fields take their values from
	// ("": Default).
	profile string
}

func fromProfile(p tune.Profile) Tuning {
	t := Tuning{BatchSize: p.BatchSize, BackoffBase: p.BackoffBase, BackoffMax: p.BackoffMax, LeaseTTL: p.LeaseTTL}
	if p.Name != tune.NameDefault {
		t.profile = p.Name
	}
	return t
}

// ProfileName returns the name of the profile t was made from, whose
// values its zero fields take: "default" for a Tuning made by hand.
func (t Tuning) ProfileName() string {
	if t.profile == "" {
		return tune.NameDefault
	}
	return t.profile
}

// WithDefaults returns t with each zero field set to its profile's value,
// as a Subscriber uses it. BackoffBase is at most BackoffMax, and
// BackoffMax at least BackoffBase, when only the other one is set.
func (t Tuning) WithDefaults() Tuning {
	p, _ := tune.Lookup(t.profile)
	if t.BatchSize == 0 {
		t.BatchSize = p.BatchSize
	}
	if t.BackoffBase == 0 {
		t.BackoffBase = p.BackoffBase
		if t.BackoffMax > 0 {
			t.BackoffBase = min(t.BackoffBase, t.BackoffMax)
		}
	}
	if t.BackoffMax == 0 {
		t.BackoffMax = max(p.BackoffMax, t.BackoffBase)
	}
	if t.LeaseTTL == 0 {
		t.LeaseTTL = p.LeaseTTL
	}
	return t
}

// AppendInterval returns the pace of the profile t was made from for
// the steps that bring messages into the log: the Subscriber's own
// sequencer's pass interval, and the one to give a log-based mode relay
// (relay.Config.MinAppendInterval) whose topics are read with t, so that
// both publishing modes take a stream of commits in steps of the same
// size: 20 ms for Default and HighThroughput, 2 ms for LowLatency,
// 100 ms for Background.
func (t Tuning) AppendInterval() time.Duration {
	p, _ := tune.Lookup(t.profile)
	return p.SequencerInterval
}

// Validate returns nil if t, with its defaults, is usable, and otherwise a
// [*outboxtype.ConfigError] describing the first problem found.
func (t Tuning) Validate() error {
	t = t.WithDefaults()
	switch {
	case t.BatchSize < 1:
		return configErrorf("BatchSize", "must be >= 1 (0 for the profile's), got %d", t.BatchSize)
	case t.BackoffBase <= 0:
		return configErrorf("BackoffBase", "must be > 0 (0 for the profile's), got %v", t.BackoffBase)
	case t.BackoffMax < t.BackoffBase:
		return configErrorf("BackoffMax", "must be >= BackoffBase (%v), got %v", t.BackoffBase, t.BackoffMax)
	case t.LeaseTTL < minLeaseTTL:
		return configErrorf("LeaseTTL", "must be >= %v (0 for the profile's), got %v", minLeaseTTL, t.LeaseTTL)
	}
	return nil
}

// Default returns the balanced profile: moderate batches (50), a fast pace
// while there is a backlog, a one-second safety-net poll while idle and a
// gentle retry backoff (1 s doubling up to 1 min).
func Default() Tuning { return fromProfile(tune.Default) }

// LowLatency returns a profile for real-time delivery (notifications,
// chat): polls a few milliseconds apart while busy and a 10 ms
// safety-net poll while idle, so a message is picked up well within 25 ms
// even without pokes. With the sequencer's notifications (the default),
// the poll of an idle partition stretches, doubling, to 30 s, so idling
// costs what it costs with Default; without them it stays at 10 ms (a
// worker whose poll found work no notification announced stretches it to
// 1 s at most, until a notification announces work again).
// Batches stay small (10) and retries start at 100 ms.
func LowLatency() Tuning { return fromProfile(tune.LowLatency) }

// HighThroughput returns a profile for bulk transfer (ETL, analytics):
// large batches (500), a pace that quickly ramps down to 1 ms while a
// backlog lasts, longer leases (60 s) for long batches and a wide
// bulkhead.
func HighThroughput() Tuning { return fromProfile(tune.HighThroughput) }

// Background returns a profile for background work where latency hardly
// matters (digests, housekeeping): a slow pace, a 30 s safety-net poll,
// degradation on the first failure, a long retry backoff (5 s up to 5 min)
// and a narrow bulkhead that keeps database load low.
func Background() Tuning { return fromProfile(tune.Background) }

// profileNames returns the names [Profile] accepts, in a stable order.
func profileNames() []string {
	return []string{tune.NameDefault, tune.NameLowLatency, tune.NameHighThroughput, tune.NameBackground}
}

// Profile returns the tuning profile with the given name: "default",
// "low-latency", "high-throughput" or "background" (case and surrounding spaces
// are ignored). Any other name yields an error matching [ErrUnknownProfile].
func Profile(name string) (Tuning, error) {
	if n := strings.ToLower(strings.TrimSpace(name)); n != "" {
		if p, ok := tune.Lookup(n); ok {
			return fromProfile(p), nil
		}
	}
	return Tuning{}, fmt.Errorf("%w %q (allowed: %s)", ErrUnknownProfile, name, strings.Join(profileNames(), ", "))
}
