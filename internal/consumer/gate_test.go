package consumer

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// A delivery alone waits for the shares in flight, keeps new ones out while
// it waits, and gives up after its wait; a share waits for it.
func TestGateAloneWaitsForSharesAndKeepsNewOnesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGate()
		ctx := context.Background()
		releaseA, err := g.share(ctx)
		if err != nil {
			t.Fatal(err)
		}
		aloneHeld := make(chan func())
		go func() {
			release, ok, evidence, err := g.holdAlone(ctx, time.Minute)
			if err != nil || !ok || !evidence {
				t.Errorf("holdAlone: ok %v, evidence %v, err %v", ok, evidence, err)
			}
			aloneHeld <- release
		}()
		synctest.Wait()
		if shares, alone, waiting, _ := g.state(); shares != 1 || alone || waiting != 1 {
			t.Fatalf("state %d %v %d, want one share and one waiting alone", shares, alone, waiting)
		}
		shareTaken := make(chan func())
		go func() {
			release, err := g.share(ctx)
			if err != nil {
				t.Error(err)
			}
			shareTaken <- release
		}()
		synctest.Wait()
		select {
		case <-shareTaken:
			t.Fatal("a new share was taken while a delivery waits to be alone")
		default:
		}
		releaseA()
		releaseA() // a second release changes nothing
		synctest.Wait()
		releaseAlone := <-aloneHeld
		if shares, alone, _, _ := g.state(); shares != 0 || !alone {
			t.Fatalf("state %d %v, want held alone", shares, alone)
		}
		select {
		case <-shareTaken:
			t.Fatal("a share was taken while the gate is held alone")
		default:
		}
		releaseAlone()
		synctest.Wait()
		(<-shareTaken)()
		if shares, alone, waiting, _ := g.state(); shares != 0 || alone || waiting != 0 {
			t.Fatalf("state %d %v %d, want free", shares, alone, waiting)
		}
	})
}

// A share that is not given back within the wait (a slow handler) makes
// holdAlone give up, and lets new shares in again.
func TestGateAloneGivesUpAfterItsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGate()
		ctx := context.Background()
		if _, err := g.share(ctx); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		release, ok, _, err := g.holdAlone(ctx, 3*time.Second)
		if err != nil || ok || release != nil {
			t.Fatalf("holdAlone: ok %v, err %v", ok, err)
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Fatalf("waited %v, want 3s", waited)
		}
		r, err := g.share(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r()
		if shares, _, waiting, _ := g.state(); shares != 1 || waiting != 0 {
			t.Fatalf("state: %d shares, %d waiting; want the slow share only", shares, waiting)
		}
	})
}

// An abandoned handler (timed out, or its lease ended) keeps nobody
// waiting, but a hold alone taken while it has not returned is no
// evidence; once it returns, it is again.
func TestGateAbandonedHandlerMakesAloneNoEvidence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGate()
		ctx := context.Background()
		if _, err := g.share(ctx); err != nil {
			t.Fatal(err)
		}
		returned := g.abandon(false)
		release, ok, evidence, err := g.holdAlone(ctx, time.Second)
		if err != nil || !ok || evidence {
			t.Fatalf("holdAlone with an abandoned handler: ok %v, evidence %v, err %v; want held, no evidence", ok, evidence, err)
		}
		// Abandoning a hold alone frees the gate at once.
		returned2 := g.abandon(true)
		if shares, alone, _, abandoned := g.state(); shares != 0 || alone || abandoned != 2 {
			t.Fatalf("state %d %v %d, want free with two abandoned", shares, alone, abandoned)
		}
		_ = release
		returned()
		returned2()
		returned() // once only
		release, ok, evidence, _ = g.holdAlone(ctx, time.Second)
		if !ok || !evidence {
			t.Fatalf("holdAlone once the handlers returned: ok %v, evidence %v", ok, evidence)
		}
		release()
	})
}

// A caller whose context ends stops waiting, with its cause.
func TestGateWaitEndsWithTheContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGate()
		_, ok, _, _ := g.holdAlone(context.Background(), time.Second)
		if !ok {
			t.Fatal("not alone")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := g.share(ctx); err == nil {
			t.Fatal("share taken while held alone")
		}
	})
}

// Deliveries waiting to be alone get the gate in the order they came, the
// first first, whatever order the Go scheduler wakes them in: several
// suspects woken by one change no longer race for it (a race the
// deterministic simulator's replays caught).
func TestGateAloneWaitersAreServedInTheOrderTheyCame(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGate()
		ctx := context.Background()
		release, err := g.share(ctx)
		if err != nil {
			t.Fatal(err)
		}
		const waiters = 8
		order := make(chan int, waiters)
		releases := make(chan func(), waiters)
		for i := range waiters {
			go func() {
				r, ok, _, err := g.holdAlone(ctx, time.Hour)
				if err != nil || !ok {
					t.Errorf("waiter %d: ok %v, %v", i, ok, err)
					return
				}
				order <- i
				releases <- r
			}()
			synctest.Wait() // waiter i waits before i+1 comes
		}
		release()
		for want := range waiters {
			synctest.Wait()
			if got := <-order; got != want {
				t.Fatalf("waiter %d held the gate alone in turn %d", got, want)
			}
			(<-releases)()
		}
	})
}
