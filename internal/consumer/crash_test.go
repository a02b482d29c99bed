package consumer

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// Crash evidence (docs/failure-modes.md §3): what the worker records
// before a hand-out, so that the next holder of the lease can tell whether
// a crash was the message's, and how it delivers the suspects of a crash
// that was nobody's for sure.

// Outside careful mode the read records the whole batch in flight, with no
// write per message.
func TestReadRecordsTheWholeBatchInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b", "c")
		r := newRig(t, s, nil, nil)
		var inflight cursorRow
		r.step(map[string]answer{"b": func(m *message.Message) { inflight = s.State(); m.Ack() }})
		if inflight.InflightFrom != 1 || inflight.InflightTo != 3 || inflight.InflightSolo {
			t.Fatalf("in flight while b is handled: %+v, want 1..3, not alone", inflight)
		}
		if len(s.Marks) != 0 || len(s.Reads) != 1 || !s.Reads[0].WholeBatch {
			t.Fatalf("reads %+v, marks %v: want one read of the whole batch, no marks", s.Reads, s.Marks)
		}
	})
}

// In careful mode each message of a one-at-a-time batch is recorded on its
// own before it is handed out.
func TestCarefulModeRecordsEachMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b", "c")
		r := newRig(t, s, nil, nil)
		r.cfg.Careful.Extend()
		var whileB cursorRow
		r.step(map[string]answer{"b": func(m *message.Message) { whileB = s.State(); m.Ack() }})
		if !slices.Equal(s.Marks, []int64{2, 3}) || s.Reads[0].WholeBatch {
			t.Fatalf("marks %v, read %+v: want b and c marked, the read recording its head only", s.Marks, s.Reads[0])
		}
		if whileB.InflightFrom != 2 || whileB.InflightTo != 2 {
			t.Fatalf("in flight while b is handled: %+v, want b alone", whileB)
		}
	})
}

// A lease whose acquisition found a crash turns careful mode on.
func TestACrashFoundTurnsCarefulModeOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, newFakeStore("a"), func(_ *Config, l *fakeLease) { l.Found.Unexplained = true }, nil)
		if !r.cfg.Careful.On() {
			t.Fatal("not careful after a crash was found")
		}
		r2 := newRig(t, newFakeStore("a"), func(_ *Config, l *fakeLease) { l.Found.Charged, l.Found.Attempts = 1, 1 }, nil)
		if !r2.cfg.Careful.On() || r2.cfg.Counts.Crashed.Load() != 1 {
			t.Fatalf("a charged crash: careful %v, counted %d", r2.cfg.Careful.On(), r2.cfg.Counts.Crashed.Load())
		}
	})
}

// A suspect head is read alone and delivered holding the gate alone: the
// read records it as the only delivery in flight in the process.
func TestSuspectIsDeliveredAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b", "c")
		r := newRig(t, s, func(_ *Config, l *fakeLease) { l.Found.SuspectFrom, l.Found.SuspectTo = 1, 2 }, nil)
		var alone bool
		_, got, _ := r.step(map[string]answer{"a": func(m *message.Message) {
			_, alone, _, _ = r.cfg.Gate.state()
			m.Ack()
		}})
		if len(got) != 1 || s.Reads[0].Limit != 1 || !s.Reads[0].Solo || !alone {
			t.Fatalf("handed out %v, read %+v, gate alone %v: want a alone", uuids(got), s.Reads[0], alone)
		}
		if _, alone, _, _ := r.cfg.Gate.state(); alone {
			t.Fatal("the gate is still held alone after the outcome was recorded")
		}
		r.step(nil) // b, the second suspect
		r.step(nil) // c, no suspect: a batch again
		if len(s.Reads) != 3 || !s.Reads[1].Solo || s.Reads[2].Solo || s.Reads[2].Limit != 8 {
			t.Fatalf("reads %+v: want b alone, then c in a batch", s.Reads)
		}
	})
}

// A batch stops before the first suspect, which is then delivered alone.
func TestBatchStopsBeforeTheFirstSuspect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b", "c", "d")
		r := newRig(t, s, func(_ *Config, l *fakeLease) { l.Found.SuspectFrom, l.Found.SuspectTo = 3, 3 }, nil)
		_, got, _ := r.step(nil)
		if !slices.Equal(uuids(got), []string{"m1", "m2"}) {
			t.Fatalf("first batch %v, want m1 m2 (before the suspect)", uuids(got))
		}
		_, got, _ = r.step(nil)
		if !slices.Equal(uuids(got), []string{"m3"}) || !s.Reads[1].Solo {
			t.Fatalf("second batch %v (read %+v), want the suspect alone", uuids(got), s.Reads[1])
		}
	})
}

// While a suspect waits for the gate alone, no other delivery starts; the
// ones in flight finish first.
func TestSuspectWaitsForTheDeliveriesInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, func(_ *Config, l *fakeLease) { l.Found.SuspectFrom, l.Found.SuspectTo = 1, 1 }, nil)
		other, err := r.cfg.Gate.share(r.lease.Context()) // a delivery of another partition
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan []*message.Message, 1)
		go func() { _, got, _ := r.step(nil); done <- got }()
		synctest.Wait()
		if _, _, waiting, _ := r.cfg.Gate.state(); waiting != 1 {
			t.Fatal("the suspect does not wait for the gate alone")
		}
		select {
		case <-done:
			t.Fatal("the suspect was delivered with another delivery in flight")
		default:
		}
		other()
		if got := <-done; len(got) != 1 || !s.Reads[0].Solo {
			t.Fatalf("the suspect: %v, read %+v", uuids(got), s.Reads)
		}
	})
}

// A suspect that cannot have the gate alone within HandlerTimeout (another
// handler is that slow) is delivered anyway, not alone: no evidence.
func TestSuspectDeliveredNotAloneAfterTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, func(_ *Config, l *fakeLease) { l.Found.SuspectFrom, l.Found.SuspectTo = 1, 1 }, nil)
		release, err := r.cfg.Gate.share(r.lease.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		start := time.Now()
		_, got, _ := r.step(nil)
		if len(got) != 1 || s.Reads[0].Solo || time.Since(start) < r.cfg.HandlerTimeout {
			t.Fatalf("handed out %d after %v, read %+v: want it delivered, not alone, after HandlerTimeout", len(got), time.Since(start), s.Reads[0])
		}
	})
}

// An abandoned handler (timed out, still running) keeps nobody waiting,
// but a delivery alone meanwhile is no evidence: recorded as not alone.
func TestAbandonedHandlerMakesAloneNoEvidence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("slow", "b")
		r := newRig(t, s, nil, nil)
		var slow atomic.Pointer[message.Message]                                      // set by the handler's goroutine
		r.step(map[string]answer{"slow": func(m *message.Message) { slow.Store(m) }}) // times out
		r.w.suspects = span{1, 1}                                                     // as if a crash made it a suspect
		time.Sleep(time.Second)
		r.step(nil)
		if last := s.Reads[len(s.Reads)-1]; last.Solo {
			t.Fatalf("read %+v: alone with an abandoned handler running", last)
		}
		slow.Load().Ack() // the abandoned handler returns
		synctest.Wait()
		if _, _, _, abandoned := r.cfg.Gate.state(); abandoned != 0 {
			t.Fatalf("%d abandoned after the handler answered", abandoned)
		}
	})
}

// The goroutine that keeps an abandoned handler's place in the gate until
// it answers is one of the Subscriber's Tasks: it outlives the worker, and
// the Tasks' Stop (the Subscriber's Close) ends it and returns only once it
// has given the place back. It once was a goroutine of its own: Close
// returned with it still running.
func TestAbandonedHandlersGateWaitIsOneOfTheTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("never")
		r := newRig(t, s, nil, nil)
		r.step(map[string]answer{"never": func(*message.Message) {}}) // times out, never answers
		if _, _, _, abandoned := r.cfg.Gate.state(); abandoned != 1 {
			t.Fatalf("%d abandoned, want the timed-out handler", abandoned)
		}
		r.w.Stop()
		synctest.Wait()
		if _, _, _, abandoned := r.cfg.Gate.state(); abandoned != 1 {
			t.Fatalf("%d abandoned once the worker stopped: the wait for the handler must outlive the worker", abandoned)
		}
		r.tasks.Stop() // the Subscriber closes
		if _, _, _, abandoned := r.cfg.Gate.state(); abandoned != 0 {
			t.Fatalf("%d abandoned when Stop returned: it did not wait for the handler's gate wait", abandoned)
		}
	})
}

// A message that used up MaxAttempts (its last failures crashes it caused
// alone) is taken out without another delivery, and counted.
func TestExhaustedHeadIsRejectedWithoutDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("crasher", "b")
		s.Cursor.Attempts, s.Cursor.Deliveries = 3, 3
		r := newRig(t, s, func(_ *Config, l *fakeLease) { l.Found.Charged, l.Found.LastError = 1, "crashed alone" }, nil)
		_, got, _ := r.step(nil)
		if len(got) != 0 {
			t.Fatalf("handed out %v: the exhausted message must not be delivered again", uuids(got))
		}
		taken := r.rejects.taken()
		if len(taken) != 1 || taken[0].UUID != "m1" || taken[0].Attempts != 3 || !errors.Is(taken[0].Reason, sentinel.ErrPoison) {
			t.Fatalf("rejected %+v", taken)
		}
		if r.cfg.Counts.Rejected.Load() != 1 || s.State().Seq != 1 {
			t.Fatalf("rejections %d, cursor %d", r.cfg.Counts.Rejected.Load(), s.State().Seq)
		}
	})
}
