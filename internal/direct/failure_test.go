package direct_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/millrace/watermill-outbox/internal/direct"
	"github.com/millrace/watermill-outbox/internal/origin"
	"github.com/millrace/watermill-outbox/internal/sim"
)

// failingReads fails the loop's reads of pending while failing is set.
type failingReads struct {
	direct.Store
	mu      sync.Mutex
	failing bool
	reads   int
}

var errReadDown = errors.New("connection refused")

func (f *failingReads) ReadPending(ctx context.Context, topic string, partitions []int32, limit int, now time.Time) ([]direct.Row, error) {
	f.mu.Lock()
	f.reads++
	failing := f.failing
	f.mu.Unlock()
	if failing {
		return nil, errReadDown
	}
	return f.Store.ReadPending(ctx, topic, partitions, limit, now)
}

func (f *failingReads) set(failing bool) (reads int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing = failing
	return f.reads
}

// countingTarget counts the reconciliations (each a takeover of the
// partition in Kafka) besides recording the rounds.
type countingTarget struct {
	recordingTarget
	reconciles int
}

func (c *countingTarget) Reconcile(ctx context.Context, o origin.Origin, topic string, cursor int64) ([]direct.Held, error) {
	c.mu.Lock()
	c.reconciles++
	c.mu.Unlock()
	return nil, nil
}

func (c *countingTarget) reconciled() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reconciles
}

// A read of pending that fails is a failure of every partition it read:
// each is counted, backs off (its next read waits BackoffBase, then
// doubles) and shows its last error and retry time on its cursor row, as
// a failed send does; nothing was sent, so nothing is reconciled with
// Kafka. Once reads work again the message goes.
func TestAFailedReadIsRecordedOnTheCursorRows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start = time.Now()
		model := sim.NewDBModel("g", time.Now)
		target := &countingTarget{}
		store := &failingReads{Store: model.Pending()}
		const backoff = time.Second
		model.InsertPending(0, "m1", "k").Commit(model)
		loop := runLoop(t, model, store, target, direct.Config{Partitions: 2, BatchSize: 10, Pace: 10 * time.Millisecond, Poll: 100 * time.Millisecond,
			BackoffBase: backoff, BackoffMax: time.Hour})
		held := func() bool {
			return model.Cursor("g", "orders", 0).Live && model.Cursor("g", "orders", 1).Live
		}
		for i := 0; i < 5000 && (len(target.sent()) == 0 || !held()); i++ {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		if len(target.sent()) != 1 || !held() {
			t.Fatalf("rounds %+v (both partitions held: %v), want m1 sent with both held", target.sent(), held())
		}
		reconciles := target.reconciled()

		store.set(true)
		model.InsertPending(1, "m2", "k2").Commit(model)
		time.Sleep(time.Second / 2) // the next looks find the read failing
		synctest.Wait()
		failedAt := store.set(true)
		if failedAt < 2 {
			t.Fatalf("%d reads, want the failing one after the first round", failedAt)
		}
		for p := range 2 {
			row := model.Cursor("g", "orders", p)
			if !strings.Contains(row.LastError, errReadDown.Error()) || !row.BackingOff {
				t.Fatalf("partition %d's cursor row %+v: want the read's error and a retry time", p, row)
			}
		}
		if c := loop.Stats(); c.Failures != 2 {
			t.Fatalf("stats %+v, want the failure counted once per partition read", c)
		}
		// Backing off: no read before BackoffBase is over.
		time.Sleep(backoff / 4)
		synctest.Wait()
		if n := store.set(false); n != failedAt {
			t.Fatalf("%d reads during the backoff, want none after the failed one (%d)", n, failedAt)
		}
		time.Sleep(2 * backoff)
		synctest.Wait()
		got := target.sent()
		if len(got) != 2 || got[1].uuid[0] != "m2" {
			t.Fatalf("rounds %+v, want m2 sent once reads work again", got)
		}
		if n := target.reconciled(); n != reconciles {
			t.Fatalf("%d reconciliations after a failed read, want none (nothing was sent)", n-reconciles)
		}
		if row := model.Cursor("g", "orders", 1); row.LastError != "" || row.Seq != 1 {
			t.Fatalf("partition 1's cursor row %+v after the message went: want seq 1 and no error", row)
		}
	})
}
