package kafka

import "sync"

// rounds is how the sends of the transactional producer share its Kafka
// transactions (a group commit). At most one round is in flight, run by
// the goroutine that leads it; sends that arrive meanwhile queue, and when
// the round ends the first of them is handed the lead of the next round,
// which takes along every send queued by then.
//
// Leading is a token, not a lock: it passes from goroutine to goroutine
// with the queue, and a round's state (txnProducer's parts, local, epoch)
// belongs to whoever holds it. It is taken and given back in one function
// — run for the sends, exclusive for work that needs the producer to
// itself (a forwarder-only partition's takeover) — and mu, which guards
// the fields, is taken and released inside each method.
type rounds struct {
	mu      sync.Mutex
	leading bool       // a goroutine holds the lead
	idle    *sync.Cond // on mu: broadcast when nobody leads
	queue   []*txnSend // waiting for the next round, in order
}

func newRounds() *rounds {
	r := &rounds{}
	r.idle = sync.NewCond(&r.mu)
	return r
}

// run puts sends (each with its lead and finished channels) into rounds
// and returns when every one of them is finished: its done and err set.
// When nobody leads, this call leads a round at once; otherwise the sends
// queue until a round takes them along (finished) or one of them is handed
// the lead (this call then leads the next round). Leading a round is
// before(), then round() on the round's sends (the first ones, then the
// queue's), then the lead handed on; the round's sends but the first are
// marked finished. With cancellable, a send whose context ends while it
// still waits in the queue leaves it with ctx.Err() (a forwarder-only
// round's sends wait for their round whatever: it takes all of them).
func (r *rounds) run(sends []*txnSend, cancellable bool, before func(), round func([]*txnSend)) {
	lead := func(first []*txnSend) {
		before()
		r.mu.Lock()
		all := append(first[:len(first):len(first)], r.queue...)
		r.queue = nil
		r.mu.Unlock()
		round(all)
		for _, s := range all[1:] {
			close(s.finished)
		}
		r.handOn()
	}
	r.mu.Lock()
	if !r.leading {
		r.leading = true
		r.mu.Unlock()
		lead(sends)
		return
	}
	r.queue = append(r.queue, sends...)
	r.mu.Unlock()
	for _, s := range sends {
		if r.wait(s, cancellable) {
			lead([]*txnSend{s})
		}
	}
}

// wait waits until s is taken into a round (false) or handed the lead
// (true). cancellable: s leaves the queue when its context ends first.
func (r *rounds) wait(s *txnSend, cancellable bool) (lead bool) {
	var done <-chan struct{}
	if cancellable {
		done = s.ctx.Done()
	}
	select {
	case <-s.lead:
		return true
	case <-s.finished:
		return false
	case <-done:
	}
	r.mu.Lock()
	if i := indexOf(r.queue, s); i >= 0 {
		r.queue = append(r.queue[:i], r.queue[i+1:]...)
		r.mu.Unlock()
		s.done, s.err = 0, s.ctx.Err()
		return false
	}
	r.mu.Unlock()
	// Taken into a round, or chosen to lead the next one meanwhile.
	select {
	case <-s.lead:
		return true
	case <-s.finished:
		return false
	}
}

// exclusive runs fn holding the lead: while no round is in flight and
// none starts.
func (r *rounds) exclusive(fn func()) {
	r.mu.Lock()
	for r.leading {
		r.idle.Wait()
	}
	r.leading = true
	r.mu.Unlock()
	defer r.handOn()
	fn()
}

// handOn gives the lead to the first send queued, or to nobody.
func (r *rounds) handOn() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.queue) > 0 {
		next := r.queue[0]
		r.queue = r.queue[1:]
		close(next.lead)
		return
	}
	r.leading = false
	r.idle.Broadcast()
}

// waitIdle waits until nobody leads (none starts once the target is
// closed: a queued send's round ends at once with ErrClosed).
func (r *rounds) waitIdle() {
	r.mu.Lock()
	for r.leading {
		r.idle.Wait()
	}
	r.mu.Unlock()
}

func indexOf(q []*txnSend, s *txnSend) int {
	for i, x := range q {
		if x == s {
			return i
		}
	}
	return -1
}
