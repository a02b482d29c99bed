package kafka

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The round protocol of the transactional producer (rounds.go), on its
// own, under testing/synctest: a send leads at once when nobody leads;
// sends arriving meanwhile queue and the next round takes them all; the
// lead passes to the first queued; exclusive work waits for the lead and
// holds it; a cancelled send leaves the queue; nobody leads at the end.

func newSend(ctx context.Context, name string) *txnSend {
	return &txnSend{ctx: ctx, topic: name, lead: make(chan struct{}), finished: make(chan struct{})}
}

// roundLog records the rounds run, each as the topics of its sends, and
// blocks each round until released.
type roundLog struct {
	mu      sync.Mutex
	rounds  [][]string
	release chan struct{}
}

func (l *roundLog) round(sends []*txnSend) {
	var names []string
	for _, s := range sends {
		names = append(names, s.topic)
		s.done = len(s.topic)
	}
	l.mu.Lock()
	l.rounds = append(l.rounds, names)
	l.mu.Unlock()
	<-l.release
}

func (l *roundLog) got() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.rounds)
}

func TestRoundsLeadQueueAndHandOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRounds()
		log := &roundLog{release: make(chan struct{})}
		run := func(sends ...*txnSend) {
			r.run(sends, false, func() {}, log.round)
		}
		ctx := t.Context()
		a, b, c, d := newSend(ctx, "a"), newSend(ctx, "b"), newSend(ctx, "c"), newSend(ctx, "d")
		var wg sync.WaitGroup
		wg.Go(func() { run(a) })
		synctest.Wait() // a leads its round, blocked in it
		wg.Go(func() { run(b) })
		synctest.Wait()
		wg.Go(func() { run(c, d) }) // two batches that go together
		synctest.Wait()
		if got := log.got(); len(got) != 1 || !slices.Equal(got[0], []string{"a"}) {
			t.Fatalf("rounds %v: want only a's, in flight", got)
		}
		log.release <- struct{}{} // a's round ends: b leads the next, with c and d
		synctest.Wait()
		if got := log.got(); len(got) != 2 || !slices.Equal(got[1], []string{"b", "c", "d"}) {
			t.Fatalf("rounds %v: want b's round with c and d", got)
		}
		log.release <- struct{}{}
		wg.Wait()
		for _, s := range []*txnSend{a, b, c, d} {
			if s.done != 1 {
				t.Errorf("send %s: done %d, want 1", s.topic, s.done)
			}
		}
		if r.leading || len(r.queue) > 0 {
			t.Fatalf("after the rounds: leading %v, queue %d; want nobody, empty", r.leading, len(r.queue))
		}
	})
}

func TestRoundsExclusiveWaitsForTheRoundAndHoldsTheLead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRounds()
		log := &roundLog{release: make(chan struct{})}
		var wg sync.WaitGroup
		wg.Go(func() { r.run([]*txnSend{newSend(t.Context(), "a")}, false, func() {}, log.round) })
		synctest.Wait()
		var order []string
		var mu sync.Mutex
		note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
		wg.Go(func() { r.exclusive(func() { note("exclusive"); time.Sleep(time.Second) }) })
		synctest.Wait() // waits for a's round
		note("a ends")
		log.release <- struct{}{}
		synctest.Wait() // exclusive runs, holding the lead
		wg.Go(func() {
			r.run([]*txnSend{newSend(t.Context(), "b")}, false, func() {}, log.round)
			note("b done")
		})
		synctest.Wait() // b waits: it is not led while exclusive holds the lead
		if got := log.got(); len(got) != 1 {
			t.Fatalf("rounds %v while exclusive work holds the lead", got)
		}
		time.Sleep(time.Second) // exclusive ends: b leads
		synctest.Wait()
		log.release <- struct{}{}
		wg.Wait()
		if want := []string{"a ends", "exclusive", "b done"}; !slices.Equal(order, want) {
			t.Fatalf("order %v, want %v", order, want)
		}
		r.waitIdle()
	})
}

func TestRoundsCancelledSendLeavesTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRounds()
		log := &roundLog{release: make(chan struct{})}
		var wg sync.WaitGroup
		wg.Go(func() { r.run([]*txnSend{newSend(t.Context(), "a")}, false, func() {}, log.round) })
		synctest.Wait()
		ctx, cancel := context.WithCancel(t.Context())
		b := newSend(ctx, "b")
		wg.Go(func() { r.run([]*txnSend{b}, true, func() {}, log.round) })
		synctest.Wait()
		cancel()
		synctest.Wait()
		if !errors.Is(b.err, context.Canceled) || b.done != 0 {
			t.Fatalf("cancelled send: done %d, err %v; want 0, context.Canceled", b.done, b.err)
		}
		if len(r.queue) != 0 {
			t.Fatalf("queue %d after the cancel, want 0", len(r.queue))
		}
		log.release <- struct{}{}
		wg.Wait()
		if got := log.got(); len(got) != 1 {
			t.Fatalf("rounds %v: the cancelled send must not run", got)
		}
		r.waitIdle()
	})
}
