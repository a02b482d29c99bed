package consumer

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// How a hand-out's outcome is settled (handle.go): rejections counted and
// undone, failure times kept for the dead letter, database errors of the
// hand-out reported as they are.

// A message whose payload is missing, dead-lettered after MaxAttempts, is
// counted as a rejection.
func TestMissingPayloadDeadLetterIsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		s.Append(Entry{PayloadMissing: true})
		r := newRig(t, s, nil, nil)
		for range 3 {
			r.step(nil)
			time.Sleep(time.Second)
		}
		if len(r.rejects.taken()) != 1 || r.cfg.Counts.Rejected.Load() != 1 {
			t.Fatalf("rejected %+v, counted %d: want m1 dead-lettered and counted once", r.rejects.taken(), r.cfg.Counts.Rejected.Load())
		}
	})
}

// A message rejected by its handler (Transactional) has its writes undone:
// only the dead letter commits with the cursor move.
func TestTransactionalRejectUndoesTheHandlersWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, transactional, nil)
		r.step(map[string]answer{"a": func(m *message.Message) {
			_ = execIn(m, "effect "+m.UUID)
			_ = Reject(m, errors.New("bad"), nil)
			m.Nack()
		}})
		if len(s.CommittedEffects()) != 0 || len(r.rejects.taken()) != 1 || s.State().Seq != 1 {
			t.Fatalf("effects %v, rejected %+v, cursor row %+v: want a dead-lettered, its write undone", s.CommittedEffects(), r.rejects.taken(), s.State())
		}
	})
}

// A dead letter carries the times of its message's first and last failure.
func TestDeadLetterCarriesTheFailureTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, nil, nil)
		var times []time.Time
		for range 3 {
			times = append(times, time.Now())
			r.step(map[string]answer{"a": nack})
			time.Sleep(time.Second)
		}
		taken := r.rejects.taken()
		if len(taken) != 1 || !taken[0].FirstFailure.Equal(times[0]) || !taken[0].LastFailure.Equal(times[2]) {
			t.Fatalf("rejected %+v: want a's failures at %v and %v", taken, times[0], times[2])
		}
	})
}

// In careful mode each message after the head is recorded as in flight
// before its hand-out; a database error there ends the turn with that
// error.
func TestMarkInFlightErrorIsReturned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		markErr := errors.New("connection reset")
		s.Fail["mark"] = markErr
		r := newRig(t, s, nil, nil)
		r.cfg.Careful.Extend()
		_, got, err := r.step(nil)
		if !errors.Is(err, markErr) || len(got) != 1 {
			t.Fatalf("turn handed out %v, err %v: want a, then the mark's error", uuids(got), err)
		}
	})
}
