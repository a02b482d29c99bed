package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// A crash of the consumer process is evidence against a message only when
// that message was the only delivery in flight in the process: with others
// in flight, any of them may have caused it. The gate is how a worker knows
// it is alone. Every delivery holds a share of the process's gate from the
// moment it is recorded as in flight until its handler has answered; a
// suspect — a message in flight when a process died with others in flight
// — is delivered holding the gate alone, from before it is recorded until
// its outcome is. See docs/failure-modes.md §3 and
// migrations/0009_crash_evidence.sql.
//
// A handler the worker stops waiting for (HandlerTimeout, or its lease
// ended) gives its share up, but the gate counts it as abandoned until it
// returns: while any is, a delivery alone is no evidence (the abandoned
// handler might crash the process), and is recorded as not alone. It does
// not keep suspects waiting: a handler that never returns must not stall
// the process.
//
// The gate is per process (a package variable), not per Subscriber: a crash
// takes every Subscriber and Forwarder of the process down at once.
var processGate = NewGate()

// Gate is a process's delivery gate: a readers–writer lock whose writer
// ("alone") waits for the readers at most a given time and keeps new
// readers out while it waits.
type Gate struct {
	mu         sync.Mutex
	shares     int           // shares held
	abandoned  int           // handlers abandoned that have not returned
	alone      bool          // held alone
	waiting    int           // callers waiting to hold it alone
	queue      []uint64      // their tickets, in the order they came
	nextTicket uint64        // the last ticket given
	sleepers   int           // callers waiting on changed
	changed    chan struct{} // closed and replaced on a change while sleepers wait
}

// NewGate returns a delivery gate of its own (Config.Gate).
func NewGate() *Gate { return &Gate{changed: make(chan struct{})} }

// share waits until the gate is not held alone and nobody waits to hold it
// alone, then takes a share. release gives it back (once; later calls do
// nothing).
func (g *Gate) share(ctx context.Context) (release func(), err error) {
	g.mu.Lock()
	for g.alone || g.waiting > 0 {
		ch := g.changed
		g.sleepers++
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			g.mu.Lock()
			g.sleepers--
			g.mu.Unlock()
			return nil, context.Cause(ctx)
		}
		g.mu.Lock()
		g.sleepers--
	}
	g.shares++
	g.mu.Unlock()
	return g.releaser(func() { g.shares-- }), nil
}

// holdAlone waits at most wait for every share to be given back, keeping
// new shares out meanwhile, and holds the gate alone. ok is false when the
// wait ran out (release is then nil). evidence is false when an abandoned
// handler of the process has not returned: a crash while the gate is held
// alone may then be that handler's.
func (g *Gate) holdAlone(ctx context.Context, wait time.Duration) (release func(), ok, evidence bool, err error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	g.mu.Lock()
	g.waiting++
	// Callers wait to hold it alone in turn, the first first: woken
	// together by a change, they would otherwise race for it, and which of
	// them got it would depend on the Go scheduler.
	g.nextTicket++
	ticket := g.nextTicket
	g.queue = append(g.queue, ticket)
	for g.alone || g.shares > 0 || g.queue[0] != ticket {
		ch := g.changed
		g.sleepers++
		g.mu.Unlock()
		select {
		case <-ch:
			g.mu.Lock()
			g.sleepers--
			continue
		case <-deadline.C:
			err = nil
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
		g.mu.Lock()
		g.sleepers--
		g.waiting--
		g.leaveQueue(ticket)
		g.wake()
		g.mu.Unlock()
		return nil, false, false, err
	}
	g.waiting--
	g.leaveQueue(ticket)
	g.alone = true
	evidence = g.abandoned == 0
	g.mu.Unlock()
	return g.releaser(func() { g.alone = false }), true, evidence, nil
}

// leaveQueue takes ticket out of the queue of callers waiting to hold the
// gate alone; g.mu is held.
func (g *Gate) leaveQueue(ticket uint64) {
	for i, t := range g.queue {
		if t == ticket {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			return
		}
	}
}

// abandon turns a hold (alone or a share) into an abandoned handler, which
// keeps no one waiting but makes a hold alone no evidence until returned is
// called.
func (g *Gate) abandon(alone bool) (returned func()) {
	g.mu.Lock()
	if alone {
		g.alone = false
	} else {
		g.shares--
	}
	g.abandoned++
	g.wake()
	g.mu.Unlock()
	return g.releaser(func() { g.abandoned-- })
}

// releaser returns a function that undoes a hold once.
func (g *Gate) releaser(undo func()) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			undo()
			g.wake()
			g.mu.Unlock()
		})
	}
}

// wake tells the waiters, if any, that the gate changed; g.mu is held.
func (g *Gate) wake() {
	if g.sleepers == 0 {
		return
	}
	close(g.changed)
	g.changed = make(chan struct{})
}

// state reports the shares held, whether it is held alone, how many wait
// to hold it alone and how many abandoned handlers have not returned (for
// tests).
func (g *Gate) state() (shares int, alone bool, waiting, abandoned int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shares, g.alone, g.waiting, g.abandoned
}

// gateHold is a worker's hold on the process's gate for the delivery in
// flight.
type gateHold struct {
	alone    bool // held alone
	evidence bool // held alone with no abandoned handler in the process
	release  func()
}

// takeGate takes the gate for the next delivery, which is of the head
// (cursor+1): alone when the head is a suspect, else a share.
func (w *Worker) takeGate(ctx context.Context) error {
	if !w.suspects.covers(w.cursor + 1) {
		return w.takeShare(ctx)
	}
	return w.takeAlone(ctx)
}

// takeAlone holds the gate alone. A suspect that cannot have it alone
// within HandlerTimeout (a handler elsewhere in the process is that slow)
// is delivered with a share: its crash is then no evidence, and it stays a
// suspect.
func (w *Worker) takeAlone(ctx context.Context) error {
	w.releaseGate()
	release, ok, evidence, err := w.gate.holdAlone(ctx, w.abandonAfter)
	if err != nil {
		return err
	}
	if !ok {
		w.logger.Info("A suspect cannot be delivered alone: other deliveries of this process did not end in time; delivering it with them", watermill.LogFields{"seq": w.cursor + 1})
		return w.takeShare(ctx)
	}
	w.gateHold = &gateHold{alone: true, evidence: evidence, release: release}
	return nil
}

// takeShare takes a share of the gate for a delivery that is not alone.
func (w *Worker) takeShare(ctx context.Context) error {
	w.releaseGate()
	release, err := w.gate.share(ctx)
	if err != nil {
		return err
	}
	w.gateHold = &gateHold{release: release}
	return nil
}

// alone reports whether the delivery in flight holds the gate alone, with
// no abandoned handler in the process: a crash now is evidence against it.
func (w *Worker) alone() bool { return w.gateHold != nil && w.gateHold.alone && w.gateHold.evidence }

// answered gives back a share once the delivery's handler has answered; a
// hold alone is kept until the outcome is recorded (releaseGate), so that
// a crash in between is not blamed on the message.
func (w *Worker) answered() {
	if w.gateHold != nil && !w.gateHold.alone {
		w.releaseGate()
	}
}

// releaseGate gives back the worker's hold, if any.
func (w *Worker) releaseGate() {
	if w.gateHold != nil {
		w.gateHold.release()
		w.gateHold = nil
	}
}

// abandonGate gives the worker's hold up for a handler it stops waiting
// for, which may still be running: the gate counts it as abandoned until
// it answers (a or b is closed or receives) or the Subscriber closes. The
// wait is one of the Subscriber's Tasks: its Close waits for it.
func (w *Worker) abandonGate(a, b <-chan struct{}) {
	h := w.gateHold
	w.gateHold = nil
	if h == nil {
		return
	}
	returned := w.gate.abandon(h.alone)
	w.s.Tasks.Go(func(stop context.Context) {
		defer returned()
		select {
		case <-a:
		case <-b:
		case <-stop.Done():
		}
	})
}

// carefulWindow is how long a Subscriber stays careful after it found that
// a consumer process of its group died mid-delivery.
const carefulWindow = time.Minute

// Careful is a Subscriber's careful mode. Normally the read that fetches a
// batch records the whole batch as in flight (no write per message): after
// a crash with several deliveries in flight, the messages of the batch
// handed out one at a time become suspects, those already answered and
// those not yet handed out with them. In careful mode — for carefulWindow
// after a worker found that a consumer process died mid-delivery, when the
// next crash is likeliest — each message of such a batch is recorded on its
// own before it is handed out (Marker, one grouped write per message), so
// that the next crash makes a suspect of the message in flight only: its
// deliveries are then counted exactly. The zero value is never careful
// until extended; a nil *Careful never is.
type Careful struct {
	until atomic.Int64 // unix nanoseconds
}

// Extend makes the mode careful for carefulWindow from now.
func (c *Careful) Extend() {
	if c != nil {
		c.until.Store(time.Now().Add(carefulWindow).UnixNano())
	}
}

// On reports whether the mode is careful now.
func (c *Careful) On() bool {
	return c != nil && time.Now().UnixNano() < c.until.Load()
}

// marksEach reports whether each message of a batch delivered one at a
// time is recorded as in flight on its own (careful mode).
func (w *Worker) marksEach() bool { return w.batch == nil && w.s.Careful.On() }
