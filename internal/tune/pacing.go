package tune

import "time"

// Pacing sets how long a worker waits between polls.
//
// While polls keep finding work, the n-th consecutive productive poll is
// followed by a wait of ActiveInterval - (n-1)·RampStep, never less than
// MinInterval (see [Pacing.ProceedDelay]). After a poll that finds nothing,
// the worker waits IdleInterval or until it is poked, whichever comes first,
// and the ramp starts over at ActiveInterval.
type Pacing struct {
	// MinInterval is the shortest wait between productive polls: the pace of
	// a sustained backlog. Must be >= 0 and <= ActiveInterval.
	MinInterval time.Duration
	// ActiveInterval is the wait after the first productive poll following
	// an idle period. Must be <= IdleInterval.
	ActiveInterval time.Duration
	// RampStep is subtracted from the wait for every further consecutive
	// productive poll. Zero keeps the pace at ActiveInterval. Must be >= 0.
	RampStep time.Duration
	// IdleInterval is the safety-net poll period while idle: without a poke,
	// an idle worker polls again after this long. A worker that is poked
	// when work arrives (the Subscriber's, by the sequencer's
	// notifications) doubles it after every poll that finds nothing, up to
	// 30 seconds (a second once a poll found work no poke announced, until
	// a poke announces work again), and comes back to it as soon as a poll
	// finds work no poke announced. Must be > 0.
	IdleInterval time.Duration
}

// Validate returns nil if p is usable, and otherwise a [*ConfigError]
// describing the first problem found.
func (p Pacing) Validate() error { return p.validate("") }

func (p Pacing) validate(prefix string) error {
	switch {
	case p.MinInterval < 0:
		return configErrorf(prefix+"MinInterval", "must be >= 0, got %v", p.MinInterval)
	case p.RampStep < 0:
		return configErrorf(prefix+"RampStep", "must be >= 0, got %v", p.RampStep)
	case p.IdleInterval <= 0:
		return configErrorf(prefix+"IdleInterval", "must be > 0, got %v", p.IdleInterval)
	case p.ActiveInterval < p.MinInterval:
		return configErrorf(prefix+"ActiveInterval", "must be >= MinInterval (%v), got %v", p.MinInterval, p.ActiveInterval)
	case p.IdleInterval < p.ActiveInterval:
		return configErrorf(prefix+"IdleInterval", "must be >= ActiveInterval (%v), got %v", p.ActiveInterval, p.IdleInterval)
	}
	return nil
}

// ProceedDelay returns the wait after the streak-th consecutive productive
// poll (streak counts from 1; values below 1 are treated as 1):
// max(MinInterval, ActiveInterval - (streak-1)·RampStep). It never
// overflows.
func (p Pacing) ProceedDelay(streak int) time.Duration {
	if p.ActiveInterval <= p.MinInterval {
		return p.MinInterval
	}
	steps := max(streak, 1) - 1
	if steps == 0 || p.RampStep <= 0 {
		return p.ActiveInterval
	}
	room := p.ActiveInterval - p.MinInterval
	if int64(steps) > int64(room/p.RampStep) {
		return p.MinInterval // steps·RampStep > room: past the floor
	}
	return max(p.ActiveInterval-time.Duration(steps)*p.RampStep, p.MinInterval)
}

// Load-following pace of the sequencer's passes and the relay's appends.
const (
	// LightLoadShare is the wait after a pass that moved one message, as a
	// share of the busy pace: 1/20 (1 ms of adaptive.Default()'s 20 ms).
	LightLoadShare = 20
	// PerMessageShare is what each further message of the pass adds to the
	// wait, as a share of the busy pace: 1/40 (500 µs of 20 ms), so that
	// the wait reaches the busy pace at 39 messages a pass. (1/80 made a
	// stream of one-message commits at 2,000–4,000 msg/s pass in steps of
	// about 5 messages, each a durable commit and a round: measured at
	// 1/40, the log-based mode's unpaced 1 msg/tx publishing went from
	// 1,859 to 3,333 msg/s at half the CPU per message, with the latency
	// at 1,000 and 100 msg/s unchanged; docs/bench-results/pace-share-issue-40.)
	PerMessageShare = 40
)

// FollowLoad returns how long after the start of a sequencer pass (or a
// relay append) that moved n messages the next one starts, for a busy
// pace of busy (SequencerConfig.MinPassInterval,
// relay.Config.MinAppendInterval): busy/LightLoadShare after a pass of at
// most one message, growing by busy/PerMessageShare with each further
// message, never more than busy. At light load a message then waits about
// a millisecond for the next pass rather than half the busy pace; as the
// load grows the wait grows with it, and each pass carries more, up to
// the busy pace's passes under a backlog. busy <= 0 (no floor) is 0.
func FollowLoad(busy time.Duration, n int) time.Duration {
	if busy <= 0 {
		return 0
	}
	light := busy / LightLoadShare
	if n <= 1 {
		return light
	}
	step := busy / PerMessageShare
	if step > 0 && time.Duration(n-1) >= (busy-light)/step {
		return busy
	}
	return min(busy, light+time.Duration(n-1)*step)
}
