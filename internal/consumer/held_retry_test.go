package consumer

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// The retries of held keys (held.go): what a worker finds held when it
// takes the lease, how often and in what order it retries, the backoff
// between retries, and the operators' requests.

// heldAlready puts seq of the store's log in the held table as a previous
// lease holder left it: failed attempts times, due at retryAt (zero: at
// once), the scan past it.
func heldAlready(s *fakeStore, seq int64, attempts int, retryAt time.Time) {
	e := s.Log[seq-1]
	s.Held[seq] = &heldRow{Hold: Hold{Seq: seq, Key: e.Key, Keyless: e.Key == "", Attempts: attempts, Err: "failed before"},
		Deliveries: attempts, RetryAt: retryAt}
	s.Cursor.Seq = max(s.Cursor.Seq, seq)
}

// roomy is key isolation with bounds the tests do not reach.
func roomy(c *Config, _ *fakeLease) {
	c.Isolation = Isolation{Enabled: true, MaxHeldKeys: 100, MaxHeldMessages: 100}
}

// A new lease holder reads the held table: a held message that is due is
// retried first, one that is not waits for its retry time.
func TestHeldRowsFoundAtAcquisitionAreServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "b", "c")
		heldAlready(s, 1, 1, time.Time{})
		heldAlready(s, 2, 1, time.Now().Add(time.Hour))
		r := newRig(t, s, isolated, nil)
		_, got, err := r.step(nil)
		if err != nil || !slices.Equal(uuids(got), []string{"m1", "m3"}) {
			t.Fatalf("first turn handed out %v (err %v): want a1, the due held message, then the scan's c1", uuids(got), err)
		}
		if len(s.Held) != 1 || s.Held[2] == nil {
			t.Fatalf("held %v: want only b1, not due for an hour", s.Held)
		}
	})
}

// Held keys whose retry is due are all served in one turn, each with the
// messages parked behind its head; a key that held nothing is free again:
// its next message is delivered by the scan, not parked.
func TestDueHeldKeysAreServedInOneTurnThenFreed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "b", "a", "b")
		r := newRig(t, s, isolated, nil)
		how := map[string]answer{"a1": nack, "b1": nack}
		for range 3 {
			r.step(how)
		}
		if len(s.Held) != 4 {
			t.Fatalf("held %v: want a1, b1 failed and a2, b2 parked", s.Held)
		}
		time.Sleep(time.Second) // both heads' backoff
		_, got, err := r.step(nil)
		if err != nil || !slices.Equal(uuids(got), []string{"m1", "m3", "m2", "m4"}) || len(s.Held) != 0 {
			t.Fatalf("turn handed out %v (err %v), held %v: want a1, a2, b1, b2 in one turn, nothing held", uuids(got), err, s.Held)
		}
		keyed(s, "a")
		s.Log[4].Payload = []byte("a3")
		_, got, _ = r.step(map[string]answer{"a3": ack})
		if !slices.Equal(uuids(got), []string{"m5"}) || len(s.Held) != 0 {
			t.Fatalf("handed out %v, held %v: want a3 delivered by the scan, key a no longer held", uuids(got), s.Held)
		}
	})
}

// A turn retries at most a batch of held messages; the others wait for
// the next turn.
func TestHeldRetriesOfATurnAreBoundedByTheBatchSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		for range 12 {
			s.Append(Entry{Payload: []byte("x")})
		}
		for seq := range int64(12) {
			heldAlready(s, seq+1, 1, time.Time{})
		}
		r := newRig(t, s, roomy, nil)
		size := r.w.mode.BatchSize()
		if size >= 12 {
			t.Fatalf("batch size %d: the test needs more held messages than a batch", size)
		}
		_, got, err := r.step(nil)
		if err != nil || len(got) != size {
			t.Fatalf("turn handed out %v (err %v): want %d, a batch", uuids(got), err, size)
		}
		if len(s.Held) != 12-size {
			t.Fatalf("%d held after the turn, want %d", len(s.Held), 12-size)
		}
	})
}

// A held head that keeps failing waits longer after each failure (the
// backoff grows with its attempts), is not retried before its time, and
// its row says how it failed.
func TestHeldRetryBackoffGrowsWithAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a")
		r := newRig(t, s, func(c *Config, l *fakeLease) {
			isolated(c, l)
			c.MaxAttempts = 10
		}, nil)
		how := map[string]answer{"a1": nack}
		r.step(how) // attempt 1: held, due in 50–100 ms
		time.Sleep(200 * time.Millisecond)
		if _, got, _ := r.step(how); len(got) != 1 { // attempt 2: due in 100–200 ms
			t.Fatalf("second turn handed out %v, want a1's retry", uuids(got))
		}
		if _, got, _ := r.step(how); len(got) != 0 {
			t.Fatalf("a turn right after a failed retry handed out %v: want nothing before the backoff", uuids(got))
		}
		time.Sleep(200 * time.Millisecond)
		if _, got, _ := r.step(how); len(got) != 1 { // attempt 3
			t.Fatalf("third turn handed out %v, want a1's retry", uuids(got))
		}
		h := s.Held[1]
		if d := time.Until(h.RetryAt); d < 200*time.Millisecond || d > 400*time.Millisecond {
			t.Fatalf("retry in %v after the third failure: want the backoff of a third failure, 200–400 ms", d)
		}
		if h.Attempts != 3 || !strings.Contains(h.Err, "attempt 3: nacked") {
			t.Fatalf("held row %+v: want 3 attempts, the last one nacked", h.Hold)
		}
	})
}

// A held message that a previous holder already delivered MaxAttempts
// times without success is rejected without another delivery.
func TestExhaustedHeldMessageIsRejectedWithoutDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a")
		heldAlready(s, 1, 3, time.Time{})
		r := newRig(t, s, isolated, nil)
		_, got, err := r.step(nil)
		taken := r.rejects.taken()
		if err != nil || len(got) != 0 {
			t.Fatalf("handed out %v (err %v): want no delivery of an exhausted message", uuids(got), err)
		}
		if len(taken) != 1 || taken[0].Seq != 1 || !errors.Is(taken[0].Reason, sentinel.ErrPoison) || len(s.Held) != 0 {
			t.Fatalf("rejected %+v, held %v: want a1 rejected as poison and released", taken, s.Held)
		}
		if taken[0].Attempts != 3 {
			t.Fatalf("dead letter's attempts %d: want the 3 deliveries that happened, not the one counted and taken back", taken[0].Attempts)
		}
	})
}

// A held retry the handler rejects through a RejectHandler of its own
// (outbox.Reject with via) goes to that handler, not the Subscriber's.
func TestHeldRetryRejectedThroughTheHandlersRejectHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a")
		r := newRig(t, s, isolated, nil)
		r.step(map[string]answer{"a1": nack})
		time.Sleep(time.Second)
		own := &rejects{}
		r.step(map[string]answer{"a1": func(m *message.Message) {
			_ = Reject(m, errors.New("bad payload"), own)
			m.Nack()
		}})
		if got := own.taken(); len(got) != 1 || got[0].Seq != 1 || len(r.rejects.taken()) != 0 || len(s.Held) != 0 {
			t.Fatalf("handler's RejectHandler got %+v, the Subscriber's %+v, held %v: want a1 in the handler's only", got, r.rejects.taken(), s.Held)
		}
	})
}

// An operator's request to dead-letter a held key is read with the held
// state, reloaded every heldReloadEvery while keys are held: every message
// of the key goes to the RejectHandler once, the head with its attempts,
// the parked ones with none.
func TestOperatorDeadLetterRequestIsCarriedOutAtReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "a")
		r := newRig(t, s, isolated, nil)
		how := map[string]answer{"a1": nack}
		r.step(how) // loads the (empty) held state; a1 held
		r.step(how) // a2 parked
		if len(s.Held) != 2 {
			t.Fatalf("held %v: want a1 and a2", s.Held)
		}
		s.Held[1].Requested = "dead_letter"
		time.Sleep(heldReloadEvery)
		_, got, _ := r.step(how)
		for range 3 {
			r.step(how)
		}
		taken := r.rejects.taken()
		if len(got) != 0 || len(taken) != 2 || taken[0].Seq != 1 || taken[1].Seq != 2 || len(s.Held) != 0 {
			t.Fatalf("handed out %v, rejected %+v, held %v: want a1 and a2 dead-lettered once each, without a retry", uuids(got), taken, s.Held)
		}
		if taken[0].Attempts != 1 || taken[1].Attempts != 0 {
			t.Fatalf("dead letters' attempts %d and %d: want 1 (a1 failed once) and 0 (a2 never delivered)", taken[0].Attempts, taken[1].Attempts)
		}
		if !errors.Is(taken[0].Reason, errDeadLetteredByOperator) {
			t.Fatalf("reason %v: want the operator's request", taken[0].Reason)
		}
	})
}

// Without a RejectHandler an operator's dead-letter request cannot be
// carried out: the worker says so once, not at every turn, and keeps
// retrying the key.
func TestDeadLetterRequestWithoutRejectHandlerIsLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a")
		heldAlready(s, 1, 1, time.Time{})
		s.Held[1].Requested = "dead_letter"
		logs := watermill.NewCaptureLogger()
		r := newRig(t, s, func(c *Config, l *fakeLease) {
			isolated(c, l)
			c.RejectHandler, c.Logger, c.MaxAttempts = nil, logs, 0
		}, nil)
		retried := 0
		for range 3 {
			_, got, _ := r.step(map[string]answer{"a1": nack})
			retried += len(got)
			time.Sleep(2 * time.Second)
		}
		warned := 0
		for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
			if strings.HasPrefix(m.Msg, "Cannot dead-letter a held key") {
				warned++
			}
		}
		if warned != 1 || retried != 3 {
			t.Fatalf("warned %d times, retried %d times: want one warning and a retry at every turn", warned, retried)
		}
	})
}
