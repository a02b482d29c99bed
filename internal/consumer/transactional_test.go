package consumer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// The Transactional strategy: the handlers' writes commit with the cursor
// move, or not at all.

// transactional configures a rig for the Transactional strategy.
func transactional(c *Config, _ *fakeLease) { c.Transactional = true }

// write answers a message by writing its uuid in the Subscriber's
// transaction, then acks.
func write(m *message.Message) {
	tx := pgexec.BindingFrom(m.Context()).Tx.(pgx.Tx)
	if _, err := tx.Exec(m.Context(), "effect "+m.UUID); err != nil {
		m.Nack()
		return
	}
	m.Ack()
}

// An acked batch commits its handlers' writes with the cursor move, in one
// transaction.
func TestTransactionalBatchCommitsWritesWithTheCursor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		r := newRig(t, s, transactional, nil)
		r.step(map[string]answer{"a": write, "b": write})
		if !slices.Equal(s.CommittedEffects(), []string{"effect m1", "effect m2"}) || s.State().Seq != 2 || s.Commits != 1 {
			t.Fatalf("effects %v, cursor %d, commits %d", s.CommittedEffects(), s.State().Seq, s.Commits)
		}
	})
}

// A nack undoes that message's writes (its savepoint) and commits the done
// prefix with the failure record.
func TestTransactionalNackUndoesOnlyThatMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "bad", "c")
		r := newRig(t, s, transactional, nil)
		r.step(map[string]answer{"a": write, "bad": func(m *message.Message) {
			tx := pgexec.BindingFrom(m.Context()).Tx.(pgx.Tx)
			_, _ = tx.Exec(m.Context(), "effect of bad")
			m.Nack()
		}})
		if !slices.Equal(s.CommittedEffects(), []string{"effect m1"}) {
			t.Fatalf("effects %v: want a's only", s.CommittedEffects())
		}
		if c := s.State(); c.Seq != 1 || c.Attempts != 1 {
			t.Fatalf("cursor row %+v", c)
		}
	})
}

// A handler that ignores a failed statement and acks has aborted the
// transaction: that message fails with ErrTxMisuse, the prefix commits.
func TestAbortedTransactionIsMisuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		r := newRig(t, s, transactional, nil)
		r.step(map[string]answer{"a": write, "b": func(m *message.Message) {
			tx := pgexec.BindingFrom(m.Context()).Tx.(pgx.Tx)
			_, _ = tx.Exec(m.Context(), "FAIL") // a unique violation, ignored
			m.Ack()
		}})
		c := s.State()
		if c.Seq != 1 || c.Attempts != 1 || !strings.Contains(c.LastError, "aborts the whole transaction") {
			t.Fatalf("cursor row %+v", c)
		}
	})
}

// Commit and Rollback of the Subscriber's transaction are refused and
// count as a failed attempt.
func TestCommitByTheHandlerIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, transactional, nil)
		var commitErr error
		r.step(map[string]answer{"a": func(m *message.Message) {
			tx := pgexec.BindingFrom(m.Context()).Tx.(pgx.Tx)
			commitErr = tx.Commit(context.Background())
			m.Ack()
		}})
		if !errors.Is(commitErr, sentinel.ErrTxMisuse) {
			t.Fatalf("Commit: %v, want ErrTxMisuse", commitErr)
		}
		if c := s.State(); c.Seq != 0 || c.Attempts != 1 || !strings.Contains(c.LastError, "Commit") {
			t.Fatalf("cursor row %+v", c)
		}
	})
}

// A handler that times out: the transaction is given up (its writes rolled
// back), the head charged; a later call on the transaction fails.
func TestTransactionalTimeoutGivesTheTransactionUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("slow")
		r := newRig(t, s, transactional, nil)
		var slow atomic.Pointer[message.Message] // set by the handler's goroutine
		dir, _, err := r.step(map[string]answer{"slow": func(m *message.Message) { slow.Store(m) }})
		if _, sleeping := dir.SleepDelay(); err != nil || !sleeping {
			t.Fatalf("directive %v, err %v", dir, err)
		}
		if c := s.State(); c.Seq != 0 || c.Attempts != 1 || !strings.Contains(c.LastError, "HandlerTimeout") {
			t.Fatalf("cursor row %+v", c)
		}
		tx := pgexec.BindingFrom(slow.Load().Context()).Tx.(pgx.Tx)
		if _, err := tx.Exec(context.Background(), "late write"); err == nil {
			t.Fatal("the abandoned transaction took a late write")
		}
		slow.Load().Ack()
		synctest.Wait()
		if len(s.CommittedEffects()) != 0 {
			t.Fatalf("effects %v of a given-up transaction", s.CommittedEffects())
		}
	})
}

// A message behind the head that times out: the head's delivery is taken
// back and the prefix is delivered alone next, so that the slow one becomes
// the head and is charged.
func TestTransactionalTimeoutBehindTheHeadRetriesSmaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "slow")
		r := newRig(t, s, transactional, nil)
		dir, _, _ := r.step(map[string]answer{"a": write, "slow": hold})
		if !dir.Proceeds() || s.State().Seq != 0 || s.State().Attempts != 0 {
			t.Fatalf("directive %v, cursor row %+v: want the prefix retried at once, nobody charged", dir, s.State())
		}
		_, got, _ := r.step(map[string]answer{"a": write})
		if !slices.Equal(uuids(got), []string{"m1"}) || s.State().Seq != 1 {
			t.Fatalf("next batch %v, cursor %d: want a alone, committed", uuids(got), s.State().Seq)
		}
	})
}

// Timing out MaxAttempts times dead-letters the message once the
// transaction is given up, counted as a rejection, not a timeout.
func TestTransactionalTimeoutsUntilMaxAttemptsCountAsAReject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("slow")
		r := newRig(t, s, func(c *Config, l *fakeLease) { c.Transactional, c.MaxAttempts = true, 2 }, nil)
		r.step(map[string]answer{"slow": hold})
		time.Sleep(time.Second)
		r.step(map[string]answer{"slow": hold})
		if len(r.rejects.taken()) != 1 || r.cfg.Counts.Rejected.Load() != 1 || r.cfg.Counts.TimedOut.Load() != 1 {
			t.Fatalf("rejected %d, counted rejections %d, timeouts %d; want 1, 1, 1",
				len(r.rejects.taken()), r.cfg.Counts.Rejected.Load(), r.cfg.Counts.TimedOut.Load())
		}
	})
}

// A rejection commits the dead letter with the cursor move and the prefix's
// writes; a RejectHandler that fails rolls all of it back.
func TestTransactionalRejectCommitsWithTheCursor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "poison")
		r := newRig(t, s, transactional, nil)
		r.rejects.fail = errors.New("no room")
		reject := func(m *message.Message) { _ = Reject(m, errors.New("bad"), nil); m.Ack() }
		_, _, err := r.step(map[string]answer{"a": write, "poison": reject})
		if err == nil || len(s.CommittedEffects()) != 0 || s.State().Seq != 0 {
			t.Fatalf("err %v, effects %v, cursor %d: want the whole batch rolled back", err, s.CommittedEffects(), s.State().Seq)
		}
		r.step(map[string]answer{"a": write, "poison": reject})
		if len(r.rejects.taken()) != 1 || !slices.Equal(s.CommittedEffects(), []string{"effect m1"}) || s.State().Seq != 2 {
			t.Fatalf("rejected %d, effects %v, cursor %d", len(r.rejects.taken()), s.CommittedEffects(), s.State().Seq)
		}
	})
}

// A database failure in the middle (a savepoint that fails because the
// connection is gone) is nobody's: nothing is charged, the delivery is
// taken back, the turn fails for the loop to back off.
func TestTransactionalDatabaseFailureChargesNobody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, transactional, nil)
		s.Fail["savepoint"] = errors.New("connection reset")
		_, got, err := r.step(nil)
		if err == nil || len(got) != 0 {
			t.Fatalf("err %v, %d handed out", err, len(got))
		}
		if c := s.State(); c.Attempts != 0 || c.Deliveries != 0 || c.InflightTo != 0 {
			t.Fatalf("cursor row %+v: want nothing charged, the delivery taken back", c)
		}
	})
}
