package consumer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/pgexec"
)

// How a batch's outcome is settled (ConsumeBatches): with the
// Transactional strategy, with key isolation, and the rejections a batch
// handler makes behind the head.

// execIn runs sql in the Subscriber's transaction that m's context carries.
func execIn(m *message.Message, sql string) error {
	tx := pgexec.BindingFrom(m.Context()).Tx.(pgx.Tx)
	_, err := tx.Exec(m.Context(), sql)
	return err
}

// A Transactional batch done entirely commits its writes with the cursor
// move.
func TestTransactionalBatchDoneCommitsItsWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		r, _ := batchRig(t, s, transactional, func(_ context.Context, b []*message.Message) (int, error) {
			for _, m := range b {
				if err := execIn(m, "effect "+m.UUID); err != nil {
					return 0, err
				}
			}
			return len(b), nil
		})
		r.step(nil)
		if !slices.Equal(s.CommittedEffects(), []string{"effect m1", "effect m2"}) || s.State().Seq != 2 || s.State().Attempts != 0 {
			t.Fatalf("effects %v, cursor row %+v: want both writes committed with the cursor at 2", s.CommittedEffects(), s.State())
		}
	})
}

// A Transactional batch handler that says it is done after one of its
// statements failed (aborting the transaction) misuses it: nothing commits,
// the head is charged with the misuse.
func TestTransactionalBatchDoneAfterAFailedStatementIsMisuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		r, _ := batchRig(t, s, transactional, func(_ context.Context, b []*message.Message) (int, error) {
			_ = execIn(b[0], "FAIL") // a unique violation taken as "already done"
			return len(b), nil
		})
		r.step(nil)
		if c := s.State(); c.Seq != 0 || c.Attempts != 1 || !strings.Contains(c.LastError, "acked, but a statement it ran in the transaction failed") {
			t.Fatalf("cursor row %+v: want the head charged with the misuse", c)
		}
		if len(s.CommittedEffects()) != 0 {
			t.Fatalf("effects %v: want none", s.CommittedEffects())
		}
	})
}

// A Transactional batch done in part is undone whole: the failure recorded
// on the head is the handler's error.
func TestTransactionalBatchDoneInPartRecordsTheHandlersError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		r, _ := batchRig(t, s, transactional, func(_ context.Context, b []*message.Message) (int, error) {
			return 1, errors.New("b failed")
		})
		r.step(nil)
		if c := s.State(); c.Seq != 0 || c.Attempts != 1 || !strings.Contains(c.LastError, "b failed") {
			t.Fatalf("cursor row %+v: want the head charged with the handler's error", c)
		}
	})
}

// A Transactional batch handler that rejects the head (and so does none of
// the batch) dead-letters it with the cursor move; the rest follows.
func TestTransactionalBatchRejectingItsHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("poison", "b")
		cause := errors.New("cannot parse")
		r, _ := batchRig(t, s, transactional, func(_ context.Context, b []*message.Message) (int, error) {
			if string(b[0].Payload) == "poison" {
				return 0, Reject(b[0], cause, nil)
			}
			return len(b), nil
		})
		r.step(nil)
		taken := r.rejects.taken()
		if len(taken) != 1 || taken[0].UUID != "m1" || !errors.Is(taken[0].Reason, cause) || s.State().Seq != 1 {
			t.Fatalf("rejected %+v, cursor row %+v: want the head dead-lettered and the cursor past it", taken, s.State())
		}
	})
}

// With key isolation, a Transactional batch done in part commits its done
// prefix, and the message that failed is held back with its key; the
// other keys go on.
func TestTransactionalIsolatedBatchCommitsThePrefixAndHoldsTheFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "b", "c")
		r, calls := batchRig(t, s, func(c *Config, l *fakeLease) {
			transactional(c, l)
			isolated(c, l)
		}, func(_ context.Context, b []*message.Message) (int, error) {
			for i, m := range b {
				if string(m.Payload) == "b1" {
					return i, errors.New("b1 failed")
				}
				if err := execIn(m, "effect "+m.UUID); err != nil {
					return i, err
				}
			}
			return len(b), nil
		})
		for range 4 {
			r.step(nil)
		}
		if !slices.Equal(s.CommittedEffects(), []string{"effect m1", "effect m3"}) || !slices.Equal(heldSeqs(s), []int64{2}) || s.State().Seq != 3 {
			t.Fatalf("effects %v, held %v, cursor row %+v after calls %v: want a1 and c1 done, b1 held", s.CommittedEffects(), heldSeqs(s), s.State(), calls.all())
		}
		if h := s.Held[2]; h.Attempts != 1 || !strings.Contains(h.Err, "b1 failed") {
			t.Fatalf("held row %+v: want b1's one failure", h.Hold)
		}
	})
}

// A batch handler may reject a message behind the head through a
// RejectHandler of its own, even when the Subscriber has none.
func TestBatchRejectBehindTheHeadThroughItsOwnHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "poison", "c")
		own := &rejects{}
		r, _ := batchRig(t, s, func(c *Config, _ *fakeLease) { c.RejectHandler = nil }, func(_ context.Context, b []*message.Message) (int, error) {
			for i, m := range b {
				if string(m.Payload) == "poison" {
					return i, Reject(m, errors.New("cannot parse"), own)
				}
			}
			return len(b), nil
		})
		r.step(nil)
		time.Sleep(time.Second)
		r.step(nil)
		if got := own.taken(); len(got) != 1 || got[0].UUID != "m2" || s.State().Seq != 3 {
			t.Fatalf("handler's RejectHandler got %+v, cursor row %+v: want m2 there, the batch done", got, s.State())
		}
	})
}

// A batch retried after its head failed gives the head its attempt number
// and the messages behind it their first.
func TestRetriedBatchNumbersTheHeadsAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		var attempts [][]string
		r, _ := batchRig(t, s, nil, func(_ context.Context, b []*message.Message) (int, error) {
			var got []string
			for _, m := range b {
				got = append(got, m.Metadata.Get(MetadataAttempt))
			}
			attempts = append(attempts, got)
			if len(attempts) == 1 {
				return 0, errors.New("a failed")
			}
			return len(b), nil
		})
		r.step(nil)
		time.Sleep(time.Second)
		r.step(nil)
		if len(attempts) != 2 || !slices.Equal(attempts[1], []string{"2", "1"}) {
			t.Fatalf("attempt numbers %v: want the retry to number a's second attempt and b's first", attempts)
		}
	})
}
