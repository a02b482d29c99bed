package consumer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// ConsumeBatches: the handler gets a batch and says how many are done.

// batchRig is a rig whose worker hands whole batches to h, recording each
// call's uuids.
func batchRig(t *testing.T, s *fakeStore, edit func(*Config, *fakeLease), h BatchHandler) (*rig, *callLog) {
	calls := &callLog{}
	record := func(ctx context.Context, batch []*message.Message) (int, error) {
		calls.add(uuids(batch))
		return h(ctx, batch)
	}
	return newRig(t, s, edit, record), calls
}

// callLog is the uuids of each batch handed out, safe for the handler
// goroutines a timed-out batch leaves running.
type callLog struct {
	mu    sync.Mutex
	calls [][]string
}

func (c *callLog) add(uuids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, uuids)
}

// all returns the calls so far.
func (c *callLog) all() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]string(nil), c.calls...)
}

func allDone(_ context.Context, b []*message.Message) (int, error) { return len(b), nil }

// A batch done entirely moves the cursor past it, each message counted.
func TestBatchDoneMovesTheCursorPastIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b", "c")
		r, calls := batchRig(t, s, nil, allDone)
		r.step(nil)
		if len(calls.all()) != 1 || len(calls.all()[0]) != 3 || s.State().Seq != 3 || r.cfg.Counts.Acked.Load() != 3 {
			t.Fatalf("calls %v, cursor %d, acked %d", calls.all(), s.State().Seq, r.cfg.Counts.Acked.Load())
		}
	})
}

// A batch done in part: the prefix moves the cursor, the rest is retried
// after the backoff, the failure recorded on its first message.
func TestBatchDoneInPartRetriesTheRest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b", "c")
		fail := true
		r, calls := batchRig(t, s, nil, func(_ context.Context, b []*message.Message) (int, error) {
			if fail {
				fail = false
				return 1, errors.New("broker refused b")
			}
			return len(b), nil
		})
		dir, _, _ := r.step(nil)
		if _, sleeping := dir.SleepDelay(); !sleeping {
			t.Fatalf("directive %v", dir)
		}
		if c := s.State(); c.Seq != 1 || c.Attempts != 1 || !strings.Contains(c.LastError, "seq 2, attempt 1: broker refused b") {
			t.Fatalf("cursor row %+v", c)
		}
		time.Sleep(time.Second)
		r.step(nil)
		if !slices.Equal(calls.all()[1], []string{"m2", "m3"}) || s.State().Seq != 3 {
			t.Fatalf("retry %v, cursor %d", calls.all()[1], s.State().Seq)
		}
	})
}

// A batch handler that does not return in time: which message hangs is
// unknown, so the batch is retried one message at a time, nobody charged.
func TestBatchTimeoutRetriesOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		hang := make(chan struct{})
		defer close(hang)
		var first atomic.Bool
		first.Store(true)
		r, calls := batchRig(t, s, nil, func(_ context.Context, b []*message.Message) (int, error) {
			if first.CompareAndSwap(true, false) {
				<-hang
			}
			return len(b), nil
		})
		dir, _, _ := r.step(nil)
		if !dir.Proceeds() || s.State().Attempts != 0 {
			t.Fatalf("directive %v, cursor row %+v: want a retry at once, nobody charged", dir, s.State())
		}
		r.step(nil)
		if len(calls.all()[1]) != 1 {
			t.Fatalf("retry batch %v: want one message", calls.all()[1])
		}
	})
}

// A single message whose batch handler times out is charged.
func TestBatchTimeoutOfOneIsCharged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		hang := make(chan struct{})
		defer close(hang)
		r, _ := batchRig(t, s, nil, func(context.Context, []*message.Message) (int, error) { <-hang; return 1, nil })
		r.step(nil)
		if c := s.State(); c.Attempts != 1 || !strings.Contains(c.LastError, "HandlerTimeout") {
			t.Fatalf("cursor row %+v", c)
		}
	})
}

// A batch handler that panics fails the batch with the panic as its error.
func TestBatchHandlerPanicIsAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r, _ := batchRig(t, s, nil, func(context.Context, []*message.Message) (int, error) { panic("boom") })
		r.step(nil)
		if c := s.State(); c.Attempts != 1 || !strings.Contains(c.LastError, "panicked: boom") {
			t.Fatalf("cursor row %+v", c)
		}
	})
}

// Reject of a message within the batch, done = its index: the prefix is
// done and the message goes to the RejectHandler.
func TestBatchRejectsAMessageWithinIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "poison", "c")
		cause := errors.New("cannot parse")
		r, _ := batchRig(t, s, nil, func(_ context.Context, b []*message.Message) (int, error) {
			for i, m := range b {
				if string(m.Payload) == "poison" {
					err := Reject(m, cause, nil)
					if !errors.Is(err, sentinel.ErrPoison) {
						t.Errorf("Reject returned %v", err)
					}
					return i, err
				}
			}
			return len(b), nil
		})
		r.step(nil)
		taken := r.rejects.taken()
		if len(taken) != 1 || taken[0].UUID != "m2" || !errors.Is(taken[0].Reason, cause) || s.State().Seq != 2 {
			t.Fatalf("rejected %+v, cursor %d", taken, s.State().Seq)
		}
	})
}

// Transactional: a batch done in part is undone whole (its writes cannot
// be split); the head is charged.
func TestTransactionalBatchDoneInPartIsUndoneWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		r, _ := batchRig(t, s, transactional, func(ctx context.Context, b []*message.Message) (int, error) {
			for _, m := range b {
				write(m)
			}
			return 1, errors.New("b failed")
		})
		r.step(nil)
		if len(s.CommittedEffects()) != 0 || s.State().Seq != 0 || s.State().Attempts != 1 {
			t.Fatalf("effects %v, cursor row %+v: want nothing committed, the head charged", s.CommittedEffects(), s.State())
		}
	})
}

// A message behind the head that keeps failing is charged each time (the
// cursor moves to it), and dead-lettered after MaxAttempts, not later.
func TestBatchFailureBehindTheHeadReachesMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "bad", "c")
		r, calls := batchRig(t, s, nil, func(_ context.Context, b []*message.Message) (int, error) {
			for i, m := range b {
				if string(m.Payload) == "bad" {
					return i, errors.New("always")
				}
			}
			return len(b), nil
		})
		for range 5 {
			r.step(nil)
			time.Sleep(time.Second)
		}
		taken := r.rejects.taken()
		if len(taken) != 1 || taken[0].UUID != "m2" || taken[0].Attempts != 3 {
			t.Fatalf("rejected %+v after %v", taken, calls.all())
		}
		handedBad := 0
		for _, c := range calls.all() {
			if slices.Contains(c, "m2") {
				handedBad++
			}
		}
		if handedBad != 3 {
			t.Fatalf("bad handed out %d times (%v), want MaxAttempts 3", handedBad, calls.all())
		}
	})
}

// A batch handler's context ends at HandlerTimeout, as its messages' do,
// and carries the Transactional strategy's transaction.
func TestBatchHandlerContextEndsAtHandlerTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		var deadline time.Time
		var hasTx bool
		r, _ := batchRig(t, s, transactional, func(ctx context.Context, b []*message.Message) (int, error) {
			deadline, _ = ctx.Deadline()
			hasTx = pgexec.BindingFrom(ctx) != nil
			return len(b), nil
		})
		start := time.Now()
		r.step(nil)
		if deadline.IsZero() || deadline.Sub(start) != r.cfg.HandlerTimeout || !hasTx {
			t.Fatalf("handler context: deadline %v after the start, transaction %v; want HandlerTimeout (%v) and the transaction", deadline.Sub(start), hasTx, r.cfg.HandlerTimeout)
		}
	})
}
