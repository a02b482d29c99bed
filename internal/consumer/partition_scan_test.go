package consumer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/worker"
)

// The scan of a partition (partition.go): suspects read alone, the
// bulkhead around its queries, exhausted heads, and what it counts, logs
// and shows.

// Suspects of a crash are read one at a time, the last one included; the
// scan reads whole batches again after them.
func TestSuspectsAreReadAloneUpToTheLast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b", "c", "d")
		r := newRig(t, s, func(_ *Config, l *fakeLease) { l.Found.SuspectFrom, l.Found.SuspectTo = 1, 2 }, nil)
		for range 3 {
			r.step(nil)
		}
		if len(s.Reads) < 3 || s.Reads[0].Limit != 1 || s.Reads[1].Limit != 1 || s.Reads[2].Limit < 2 {
			t.Fatalf("reads %+v: want m1 and m2 read alone, then a batch", s.Reads)
		}
	})
}

// The scan's read waits for a slot of the bulkhead that bounds the
// partitions querying at once.
func TestScanWaitsForABulkheadSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		bh, err := worker.NewBulkhead(1)
		if err != nil {
			t.Fatal(err)
		}
		r := newRig(t, s, func(c *Config, _ *fakeLease) { c.Bulkhead = bh }, nil)
		release, err := bh.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan []string, 1)
		go func() {
			_, got, _ := r.step(nil)
			done <- uuids(got)
		}()
		synctest.Wait()
		s.Mu.Lock()
		reads := len(s.Reads)
		s.Mu.Unlock()
		if reads != 0 {
			t.Fatalf("%d reads while the bulkhead's only slot was taken: want none", reads)
		}
		release()
		if got := <-done; len(got) != 1 || got[0] != "m1" {
			t.Fatalf("handed out %v once the slot was free, want m1", got)
		}
	})
}

// A head whose MaxAttempts deliveries were used up by a previous holder is
// rejected without a delivery; with no error recorded, its reason says so.
func TestExhaustedHeadWithoutErrorIsRejected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		s.Cursor.Attempts = 3
		r := newRig(t, s, nil, nil)
		_, got, _ := r.step(nil)
		taken := r.rejects.taken()
		if len(got) != 0 || len(taken) != 1 || taken[0].UUID != "m1" || !errors.Is(taken[0].Reason, sentinel.ErrPoison) ||
			!strings.Contains(taken[0].Reason.Error(), "last error: no error recorded") {
			t.Fatalf("handed out %v, rejected %+v: want m1 rejected without a delivery, no error recorded", uuids(got), taken)
		}
	})
}

// A batch read is counted once; a read that finds nothing is not.
func TestBatchesCountedOnlyWhenRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, nil, nil)
		r.step(nil)
		s.Append(Entry{Payload: []byte("b")})
		r.step(nil)
		r.step(nil)
		if n := r.cfg.Counts.Batches.Load(); n != 2 {
			t.Fatalf("%d batches counted, want 2: the reads of a and of b, not the empty one", n)
		}
	})
}

// Once the scan is past the suspects, its batches are no longer read one
// at a time: a batch that is not full ends the turn idle.
func TestPastTheSuspectsBatchesAreNormalAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		r := newRig(t, s, func(_ *Config, l *fakeLease) { l.Found.SuspectFrom, l.Found.SuspectTo = 1, 1 }, nil)
		r.step(nil) // a, alone
		dir, got, _ := r.step(nil)
		if len(got) != 1 || got[0].UUID != "m2" || dir.Proceeds() {
			t.Fatalf("turn after the suspect handed out %v and ended with %v: want b, then idle (the batch was not full)", uuids(got), dir)
		}
	})
}

// A worker whose lease found no delivery charged to a crash reports none.
func TestNoCrashReportedWithoutCharge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := watermill.NewCaptureLogger()
		r := newRig(t, newFakeStore("a"), func(c *Config, _ *fakeLease) { c.Logger = logs }, nil)
		r.step(nil)
		for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
			if strings.HasPrefix(m.Msg, "A delivery ended without an outcome") {
				t.Fatalf("logged %q with nothing charged", m.Msg)
			}
		}
		if n := r.cfg.Counts.Crashed.Load(); n != 0 {
			t.Fatalf("%d crashes counted, want 0", n)
		}
	})
}

// After a failure the cursor row shows the worker's adaptive state.
func TestAdaptiveStateShownAfterAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, nil, nil)
		r.step(map[string]answer{"a": nack})
		if got, want := s.State().Adaptive, r.w.mode.State().String(); got == "" || got != want {
			t.Fatalf("cursor row shows adaptive state %q, want %q", got, want)
		}
	})
}
