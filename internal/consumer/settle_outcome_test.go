package consumer

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// How a turn's outcome is recorded (settle.go, ledger.go): the
// Transactional strategy's commits, failures counted on the cursor row,
// the bounds' fallback, and the texts a dead letter carries.

// Consecutive Transactional turns each deliver the next messages: a
// commit moves the worker's scan with the cursor row.
func TestTransactionalTurnsGoOnAfterACommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, transactional, nil)
		r.step(map[string]answer{"a": write})
		s.Append(Entry{Payload: []byte("b")})
		_, got, err := r.step(map[string]answer{"b": write})
		if err != nil || len(got) != 1 || got[0].UUID != "m2" || s.State().Seq != 2 {
			t.Fatalf("second turn handed out %v, err %v, cursor row %+v: want b delivered and committed", uuids(got), err, s.State())
		}
	})
}

// A Transactional head that fails again has each failure counted on the
// cursor row.
func TestTransactionalFailuresAccumulate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, func(c *Config, l *fakeLease) {
			transactional(c, l)
			c.MaxAttempts = 10
		}, nil)
		for range 2 {
			r.step(map[string]answer{"a": nack})
			time.Sleep(time.Second)
		}
		if c := s.State(); c.Seq != 0 || c.Attempts != 2 {
			t.Fatalf("cursor row %+v: want a's 2 failures counted", c)
		}
	})
}

// With the Transactional strategy and key isolation, a failing message
// the bounds keep from being held blocks the scan for its backoff.
func TestTransactionalIsolationBoundsBlockTheScan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "b", "c")
		r := newRig(t, s, func(c *Config, l *fakeLease) {
			transactional(c, l)
			isolated(c, l)
		}, nil)
		fail := map[string]answer{"a1": nack, "b1": nack, "c1": nack}
		for range 3 {
			r.step(fail)
		}
		if !r.w.iso.full || s.State().Attempts != 1 {
			t.Fatalf("full %v, cursor row %+v: want the bounds reached, c1's failure counted", r.w.iso.full, s.State())
		}
		dir, got, _ := r.step(fail)
		if _, sleeping := dir.SleepDelay(); !sleeping || len(got) != 0 {
			t.Fatalf("turn right after c1 failed: directive %v, handed out %v: want a sleep, no delivery", dir, uuids(got))
		}
	})
}

// A handler that never answers is given up HandlerTimeout plus a tenth of
// it (at most a second) after its hand-out.
func TestHungHandlerGivenUpAfterItsGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, nil, nil)
		start := time.Now()
		r.step(map[string]answer{"a": hold})
		if took := time.Since(start); took != 1100*time.Millisecond {
			t.Fatalf("turn with a hung handler took %v, want 1.1s (HandlerTimeout 1s + 100ms)", took)
		}
	})
}

// A message dead-lettered after MaxAttempts failures, each its own
// delivery, says so without speaking of crashes.
func TestDeadLetterReasonCountsFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, nil, nil)
		for range 3 {
			r.step(map[string]answer{"a": func(m *message.Message) { m.Nack() }})
			time.Sleep(time.Second)
		}
		taken := r.rejects.taken()
		if len(taken) != 1 || !strings.Contains(taken[0].Reason.Error(), "failed 3 times (MaxAttempts 3)") || strings.Contains(taken[0].Reason.Error(), "cut short") {
			t.Fatalf("rejected %+v: want the reason \"failed 3 times (MaxAttempts 3)\"", taken)
		}
	})
}

// An error text of 2000 bytes is kept whole; a longer one is cut there.
func TestErrorTextBoundIs2000Bytes(t *testing.T) {
	exact := errors.New(strings.Repeat("x", 2000))
	if got := fmtErr(exact); got.Error() != exact.Error() {
		t.Fatalf("a 2000-byte error became %d bytes", len(got.Error()))
	}
	if got := fmtErr(errors.New(strings.Repeat("x", 2001))); got.Error() != strings.Repeat("x", 2000)+"…" {
		t.Fatalf("a 2001-byte error became %q", got.Error()[1990:])
	}
}
