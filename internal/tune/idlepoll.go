package tune

import "time"

// IdlePoll is the schedule of an idle loop's safety-net poll (the
// sequencer's, a forwarder-only topic's): the wait doubles after every
// look that found nothing, up to Base (its poll interval), and on up to
// Max while notifications can be trusted: the LISTEN connection is up
// (Live) and no unprompted look found work since the last notified round
// that did.
type IdlePoll struct {
	Base, Max time.Duration
	// Live reports whether the LISTEN subscription is live (nil: the loop
	// does not listen).
	Live func() bool
	// missed: an unprompted look at the idle pace found work that no
	// notification announced.
	missed bool
}

// Trusted reports whether notifications announce new work now.
func (p *IdlePoll) Trusted() bool {
	return p.Live != nil && !p.missed && p.Live()
}

// Next is the wait after an empty look that followed a wait of last (0:
// none yet).
func (p *IdlePoll) Next(last time.Duration) time.Duration {
	ceiling := p.Base
	if p.Max > p.Base && p.Trusted() {
		ceiling = p.Max
	}
	if last <= 0 {
		return p.Base
	}
	return min(2*last, ceiling)
}

// Unannounced records an unprompted look after a wait of last that found
// work: at the idle pace (last at least base) the notifications missed it.
// (A look soon after a round is how a loop finds the commits whose NOTIFY
// the Publisher left out on purpose; those are expected.)
func (p *IdlePoll) Unannounced(last time.Duration) {
	if last >= p.Base {
		p.missed = true
	}
}

// Announced records a notified pass that found work: notifications work.
func (p *IdlePoll) Announced() { p.missed = false }
