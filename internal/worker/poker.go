package worker

// Poker wakes an idle worker before its IdleInterval has passed. Pokes
// coalesce: while one is pending, further pokes are dropped, so a burst of
// pokes wakes the worker once. If several workers share a Poker, each poke
// wakes at most one of them.
//
// Create a Poker with [NewPoker]. A nil *Poker is valid and ignores pokes.
// Poker is safe for concurrent use.
type Poker struct {
	ch chan struct{}
}

// NewPoker returns a Poker with no poke pending.
func NewPoker() *Poker {
	return &Poker{ch: make(chan struct{}, 1)}
}

// Poke marks a wake-up as pending. It never blocks.
func (p *Poker) Poke() {
	if p == nil {
		return
	}
	select {
	case p.ch <- struct{}{}:
	default: // one is already pending
	}
}

// wake returns the channel that delivers pending pokes, nil for a nil Poker
// (a nil channel never delivers).
func (p *Poker) wake() <-chan struct{} {
	if p == nil {
		return nil
	}
	return p.ch
}
