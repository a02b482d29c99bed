package consumer

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// The gate's bookkeeping of its waiters: once every caller that waited has
// left (woken, timed out or cancelled), the gate counts no sleepers, so
// that its releases stop closing and replacing its channel for nobody.

// sleeping reads the gate's count of callers waiting on its channel.
func (g *Gate) sleeping() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sleepers
}

// A share waiter cancelled, a share waiter woken, a caller waiting to be
// alone woken and one whose wait ran out: none is counted afterwards.
func TestGateCountsNoSleepersOnceTheWaitersLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGate()
		ctx := context.Background()
		releaseAlone, ok, _, err := g.holdAlone(ctx, time.Second)
		if err != nil || !ok {
			t.Fatalf("holdAlone: ok %v, err %v", ok, err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancelled := make(chan error, 1)
		go func() {
			_, err := g.share(cctx)
			cancelled <- err
		}()
		shared := make(chan func(), 1)
		go func() {
			release, err := g.share(ctx)
			if err != nil {
				t.Error(err)
			}
			shared <- release
		}()
		synctest.Wait()
		if n := g.sleeping(); n != 2 {
			t.Fatalf("%d sleepers, want the 2 share waiters", n)
		}
		cancel()
		if err := <-cancelled; err == nil {
			t.Fatal("a cancelled share waiter got a share")
		}
		releaseAlone()
		(<-shared)() // woken, takes its share and gives it back
		if n := g.sleeping(); n != 0 {
			t.Fatalf("%d sleepers after the share waiters left, want 0", n)
		}

		releaseShare, err := g.share(ctx)
		if err != nil {
			t.Fatal(err)
		}
		timedOut := make(chan bool, 1)
		go func() {
			_, ok, _, _ := g.holdAlone(ctx, time.Second)
			timedOut <- !ok
		}()
		synctest.Wait()
		if !<-timedOut {
			t.Fatal("holdAlone got the gate alone while a share was held")
		}
		if n := g.sleeping(); n != 0 {
			t.Fatalf("%d sleepers after a wait to be alone ran out, want 0", n)
		}
		woken := make(chan func(), 1)
		go func() {
			release, ok, _, err := g.holdAlone(ctx, time.Minute)
			if err != nil || !ok {
				t.Errorf("holdAlone: ok %v, err %v", ok, err)
			}
			woken <- release
		}()
		synctest.Wait()
		releaseShare()
		(<-woken)()
		if n := g.sleeping(); n != 0 {
			t.Fatalf("%d sleepers after a caller waiting to be alone was woken, want 0", n)
		}
	})
}

// Careful mode lasts carefulWindow from its last extension, not longer.
func TestCarefulModeEndsAfterItsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Careful
		c.Extend()
		time.Sleep(carefulWindow - time.Nanosecond)
		if !c.On() {
			t.Fatal("careful mode off before its window ended")
		}
		time.Sleep(time.Nanosecond)
		if c.On() {
			t.Fatal("careful mode still on when its window ended")
		}
	})
}
