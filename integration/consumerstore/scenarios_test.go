package consumerstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// msg is a message of the scenarios' log ("" key: keyless).
type msg struct{ uuid, key, payload string }

func (m msg) message() *message.Message {
	w := message.NewMessage(m.uuid, []byte(m.payload))
	if m.key != "" {
		w.Metadata.Set(outbox.PublishPartitionKeyMetadata, m.key)
	}
	w.Metadata.Set("n", strings.TrimLeft(m.uuid, "abx"))
	return w
}

// theLog is the log every scenario starts with: keys a and b, a keyless
// message, seqs 1..6 in this order (one partition).
var theLog = []msg{{"a1", "a", "pa1"}, {"b1", "b", "pb1"}, {"a2", "a", "pa2"}, {"x1", "", "px1"}, {"b2", "b", "pb2"}, {"a3", "a", "pa3"}}

// script runs a scenario on one side and writes its transcript: what each
// call returned (the error's class, not its text) and, at each look, the
// rows the side keeps.
type script struct {
	t     *testing.T
	ctx   context.Context
	s     *side
	lines []string
}

func (c *script) say(format string, args ...any) {
	c.lines = append(c.lines, fmt.Sprintf(format, args...))
}

// look records the rows: the cursor row, the held rows, the committed
// writes.
func (c *script) look(label string) {
	c.say("%s: cursor %+v", label, c.s.cursor())
	for _, h := range c.s.held() {
		c.say("%s: held %+v", label, h)
	}
	c.say("%s: effects %v", label, c.s.effects())
}

// acquired records what the lease says of its acquisition.
func (c *script) acquired() {
	l := c.s.lease
	from, to := l.Suspects()
	c.say("lease: partition %d owner %q cursor %d attempts %d last error %q backing off %v charged %d suspects %d..%d unexplained %v",
		l.Partition(), l.Owner(), l.Cursor(), l.Attempts(), l.LastError(), l.Backoff() > 0, l.Charged(), from, to, l.UnexplainedCrash())
}

func (c *script) read(cursor int64, limit int, fenced, whole, solo bool) {
	var fence consumer.Lease
	if fenced {
		fence = c.s.lease
	}
	es, counted, err := c.s.store.Read(c.ctx, topic, 0, cursor, limit, fence, whole, solo)
	n := "nil"
	if counted != nil {
		n = strconv.Itoa(int(*counted))
	}
	c.say("read after %d (limit %d, fenced %v, whole %v, solo %v): %s counted %s: %s", cursor, limit, fenced, whole, solo, entries(es), n, errClass(err))
}

func (c *script) readSeqs(seqs ...int64) {
	es, err := c.s.store.ReadSeqs(c.ctx, topic, 0, seqs)
	c.say("read seqs %v: %s: %s", seqs, entries(es), errClass(err))
}

func (c *script) advance(tx pgx.Tx, seq int64) error {
	err := c.s.lease.Advance(c.ctx, tx, seq)
	c.say("advance to %d (in tx %v): %s", seq, tx != nil, errClass(err))
	return err
}

func (c *script) advanceRelaxed(seq int64) {
	c.say("advance relaxed to %d: %s", seq, errClass(c.s.lease.AdvanceRelaxed(c.ctx, seq)))
}

func (c *script) retry(tx pgx.Tx, text string, in time.Duration) error {
	err := c.s.lease.RecordRetry(c.ctx, tx, errors.New(text), in)
	c.say("record retry %q in %v (in tx %v): %s", text, in, tx != nil, errClass(err))
	return err
}

func (c *script) undo(cursor int64) {
	c.say("undo delivery at %d: %s", cursor, errClass(c.s.lease.UndoDelivery(c.ctx, cursor)))
}

func (c *script) verify(seq int64) {
	c.say("verify at %d: %s", seq, errClass(c.s.lease.Verify(c.ctx, "scenario", seq)))
}

func (c *script) mark(seq int64) {
	ok, err := c.s.store.MarkInFlight(c.ctx, topic, c.s.lease, seq)
	c.say("mark %d in flight: %v %s", seq, ok, errClass(err))
}

func (c *script) saveAdaptive(state string, size int) {
	err := c.s.store.SaveAdaptive(c.ctx, topic, 0, c.s.lease.Token(), state, size)
	c.say("save adaptive %s %d: %s", state, size, errClass(err))
}

func (c *script) begin() pgx.Tx {
	tx, err := c.s.store.Begin(c.ctx)
	c.say("begin: %s", errClass(err))
	if err != nil {
		c.t.Fatal(err)
	}
	return tx
}

// exec runs a handler's write of label in tx.
func (c *script) exec(tx pgx.Tx, label string) error {
	_, err := tx.Exec(c.ctx, c.s.write(label))
	c.say("write %s: %s", label, errClass(err))
	return err
}

func (c *script) savepoint(tx pgx.Tx, op consumer.SavepointOp) {
	c.say("savepoint op %d: %s", op, errClass(c.s.store.Savepoint(c.ctx, tx, op)))
}

func (c *script) commit(tx pgx.Tx) {
	c.say("commit: %s", errClass(tx.Commit(c.ctx)))
}

func (c *script) rollback(tx pgx.Tx) {
	c.say("rollback: %s", errClass(tx.Rollback(c.ctx)))
}

func (c *script) inTx(relaxed bool, label string, fn func(tx pgx.Tx) error) {
	err := c.s.store.InTx(c.ctx, relaxed, fn)
	c.say("in tx (relaxed %v) %s: %s", relaxed, label, errClass(err))
}

func (c *script) heldAdopt() {
	c.say("held adopt: %s", errClass(c.s.store.HeldAdopt(c.ctx, topic, c.s.lease)))
}

func (c *script) heldLoad() {
	rows, err := c.s.store.HeldLoad(c.ctx, topic, 0)
	c.say("held load: %d rows: %s", len(rows), errClass(err))
	now := time.Now()
	for _, r := range rows {
		c.say("  held row seq %d keyless %v key %q attempts %d deliveries %d last error %q first failure %v retry %s requested %q suspect %v",
			r.Seq, r.Keyless, r.Key, r.Attempts, r.Deliveries, r.LastError, r.FirstFailure != nil, retryView(r.RetryAt, now), r.Requested, r.Suspect)
	}
}

func (c *script) heldInsert(tx pgx.Tx, rows ...consumer.Hold) error {
	err := c.s.store.HeldInsert(c.ctx, tx, topic, 0, rows)
	c.say("held insert %+v: %s", rows, errClass(err))
	return err
}

func (c *script) heldCount(seq int64, solo bool) {
	n, ok, err := c.s.store.HeldCount(c.ctx, topic, c.s.lease, seq, solo)
	c.say("held count %d (solo %v): %d %v %s", seq, solo, n, ok, errClass(err))
}

func (c *script) heldUndo(seq int64) {
	c.say("held undo count %d: %s", seq, errClass(c.s.store.HeldUndoCount(c.ctx, topic, c.s.lease, seq)))
}

func (c *script) heldRetry(seq int64, text string, delay time.Duration) {
	ok, err := c.s.store.HeldRetry(c.ctx, topic, c.s.lease, seq, text, delay)
	c.say("held retry %d %q in %v: %v %s", seq, text, delay, ok, errClass(err))
}

func (c *script) heldRelease(tx pgx.Tx, seqs ...int64) error {
	n, err := c.s.store.HeldRelease(c.ctx, tx, topic, c.s.lease, seqs)
	c.say("held release %v (in tx %v): %d %s", seqs, tx != nil, n, errClass(err))
	return err
}

func (c *script) heldShowFull(full bool) {
	c.say("held show full %v: %s", full, errClass(c.s.store.HeldShowFull(c.ctx, topic, c.s.lease, full)))
}

// scenarios are the scripts both sides run, by name.
var scenarios = []struct {
	name string
	run  func(c *script)
}{
	{"CountedReadsAndCursorMoves", countedReadsAndCursorMoves},
	{"TransactionsAndSavepoints", transactionsAndSavepoints},
	{"HeldKeys", heldKeys},
	{"NewLeaseAdoptsHeldRetries", newLeaseAdoptsHeldRetries},
	{"LostLease", func(c *script) { fencedWritesAfter(c, c.s.lose) }},
	{"ExpiredLease", func(c *script) { fencedWritesAfter(c, c.s.expire) }},
	{"CrashEvidence", crashEvidence},
	{"SavepointStack", savepointStack},
}

// The fake against PostgreSQL: every scenario runs on both, and the
// transcripts must be equal line for line.
func TestFakeStoreIsPostgreSQL(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			pg, log := pgSide(t, theLog)
			fake := fakeSide(log)
			want := runScript(t, pg, sc.run)
			got := runScript(t, fake, sc.run)
			if diff := compareLines(want, got); diff != "" {
				t.Fatalf("the fake differs from PostgreSQL:\n%s", diff)
			}
			t.Logf("%d lines of transcript agree", len(want))
		})
	}
}

func runScript(t *testing.T, s *side, run func(c *script)) []string {
	c := &script{t: t, ctx: outboxtest.Ctx(t), s: s}
	c.acquired()
	c.look("start")
	run(c)
	c.look("end")
	return c.lines
}

// compareLines returns "" when want and got are equal, else the first
// difference in its context.
func compareLines(want, got []string) string {
	n := max(len(want), len(got))
	line := func(l []string, i int) string {
		if i < len(l) {
			return l[i]
		}
		return "(none)"
	}
	for i := range n {
		if line(want, i) == line(got, i) {
			continue
		}
		var b strings.Builder
		for j := max(0, i-4); j < min(n, i+4); j++ {
			mark := " "
			if line(want, j) != line(got, j) {
				mark = "≠"
			}
			fmt.Fprintf(&b, "%s line %d\n    postgres: %s\n    fake:     %s\n", mark, j+1, line(want, j), line(got, j))
		}
		return b.String()
	}
	return ""
}

// Counted reads (limits, the head's deliveries, what is in flight), the
// delivery undone, careful mode's marks, fenced and relaxed cursor moves
// (a seq not ahead), failed attempts with and without a backoff, Verify,
// the adaptive state, reads of seqs.
func countedReadsAndCursorMoves(c *script) {
	c.read(0, 3, false, false, false)
	c.read(0, 3, true, false, true)
	c.read(0, 3, true, false, true)
	c.look("counted twice")
	c.undo(0)
	c.look("undone")
	c.undo(0)
	c.read(0, 4, true, true, false)
	c.look("whole batch in flight")
	c.read(1, 2, true, false, false) // not the cursor row's seq: not counted
	c.mark(2)
	c.look("marked")
	c.advance(nil, 2)
	c.look("advanced")
	c.advance(nil, 2)
	c.advance(nil, 1)
	c.advanceRelaxed(3)
	c.advanceRelaxed(3)
	c.mark(3) // not ahead of the cursor
	c.read(3, 10, true, false, false)
	c.retry(nil, "boom", 0)
	c.look("failed")
	c.read(3, 1, true, false, true)
	c.retry(nil, "boom again", time.Hour)
	c.look("backing off")
	c.read(3, 2, true, false, true)
	c.verify(3)
	c.verify(-1)
	c.saveAdaptive("degraded", 2)
	c.advance(nil, 6)
	c.read(6, 3, true, false, true) // past the end
	c.readSeqs(5, 2, 9, 2)
	c.acquired()
}

// A Transactional batch: per-message savepoints, a handler write that
// fails and aborts the transaction, the batch savepoint, the cursor moved
// in the transaction; a rollback, a commit of an aborted transaction,
// InTx (a dead letter's transaction) with and without an error.
func transactionsAndSavepoints(c *script) {
	tx := c.begin()
	c.savepoint(tx, consumer.SavepointFirst)
	c.exec(tx, "a")
	c.savepoint(tx, consumer.SavepointNext)
	c.exec(tx, "FAIL")
	c.exec(tx, "b")
	c.savepoint(tx, consumer.SavepointNext)
	c.savepoint(tx, consumer.SavepointRollback)
	c.exec(tx, "c")
	c.savepoint(tx, consumer.SavepointRelease)
	c.savepoint(tx, consumer.SavepointBatch)
	c.exec(tx, "d")
	c.savepoint(tx, consumer.SavepointBatchRollback)
	c.savepoint(tx, consumer.SavepointBatchRelease)
	c.savepoint(tx, consumer.SavepointBatch)
	c.exec(tx, "e")
	c.savepoint(tx, consumer.SavepointBatchRelease)
	c.advance(tx, 2)
	c.commit(tx)
	c.look("committed")
	c.rollback(tx)
	c.exec(tx, "late")
	c.savepoint(tx, consumer.SavepointNext)
	c.commit(tx)

	tx = c.begin()
	c.exec(tx, "f")
	c.advance(tx, 3)
	c.look("uncommitted") // seen from outside the transaction
	c.rollback(tx)
	c.look("rolled back")

	tx = c.begin()
	c.exec(tx, "FAIL")
	c.commit(tx)
	c.look("aborted")

	c.inTx(true, "write and move", func(tx pgx.Tx) error {
		if err := c.exec(tx, "g"); err != nil {
			return err
		}
		return c.advance(tx, 3)
	})
	c.inTx(false, "handler error", func(tx pgx.Tx) error {
		if err := c.exec(tx, "h"); err != nil {
			return err
		}
		return errors.New("handler failed")
	})
	c.inTx(false, "move not ahead", func(tx pgx.Tx) error { return c.advance(tx, 3) })
	c.look("after InTx")
	c.read(3, 1, true, false, true)
	c.inTx(false, "failed attempt", func(tx pgx.Tx) error { return c.retry(tx, "in tx", time.Hour) })
	c.look("failed in tx")
	c.read(3, 1, true, false, true)
	c.inTx(false, "dead letter", func(tx pgx.Tx) error {
		if err := c.exec(tx, "dead letter 4"); err != nil {
			return err
		}
		return c.advance(tx, 4)
	})
}

// Key isolation: messages held back with the scan move, a held row
// already there, a hold rolled back, retries counted, undone and failed,
// the bounds shown, releases (acked, dead-lettered in a transaction).
func heldKeys(c *script) {
	c.inTx(true, "hold and move", func(tx pgx.Tx) error {
		if err := c.heldInsert(tx,
			consumer.Hold{Seq: 1, Key: "a", Attempts: 1, Err: "nacked", Delay: time.Hour},
			consumer.Hold{Seq: 3, Key: "a"},
			consumer.Hold{Seq: 4, Keyless: true, Attempts: 2, Err: "failed twice"}); err != nil {
			return err
		}
		return c.advance(tx, 4)
	})
	c.look("held")
	c.heldLoad()
	c.inTx(false, "hold again", func(tx pgx.Tx) error {
		return c.heldInsert(tx, consumer.Hold{Seq: 1, Key: "a", Attempts: 5, Err: "other"})
	})
	tx := c.begin()
	c.heldInsert(tx, consumer.Hold{Seq: 5, Key: "b"})
	c.heldLoad() // outside the transaction: not yet
	c.rollback(tx)
	c.look("held again, rolled back")
	c.heldCount(1, true)
	c.look("counted")
	c.heldUndo(1)
	c.heldCount(1, false)
	c.heldRetry(1, "again", time.Hour)
	c.heldRetry(4, "not counted", 0)
	c.look("retried")
	c.heldCount(99, true)
	c.heldRetry(99, "gone", 0)
	c.heldUndo(99)
	c.heldShowFull(true)
	c.look("full")
	c.heldShowFull(false)
	c.readSeqs(4, 1, 3)
	c.heldRelease(nil, 3, 99)
	c.inTx(false, "dead letter", func(tx pgx.Tx) error {
		if err := c.exec(tx, "dead letter 1"); err != nil {
			return err
		}
		return c.heldRelease(tx, 1, 98)
	})
	c.heldLoad()
}

// A new lease holder settles the held retries the last holder left in
// flight: one alone in its process (charged), one with others (a suspect).
func newLeaseAdoptsHeldRetries(c *script) {
	c.inTx(false, "hold and move", func(tx pgx.Tx) error {
		if err := c.heldInsert(tx,
			consumer.Hold{Seq: 1, Key: "a", Attempts: 1, Err: "nacked"},
			consumer.Hold{Seq: 2, Key: "b", Attempts: 1, Err: "nacked"},
			consumer.Hold{Seq: 3, Key: "a"}); err != nil {
			return err
		}
		return c.advance(tx, 3)
	})
	c.retry(nil, "head failed", time.Hour)
	c.heldCount(1, true)
	c.heldCount(2, false)
	c.look("in flight")
	c.s.lease = c.s.reacquire()
	c.acquired()
	c.heldAdopt()
	c.look("adopted")
	c.heldLoad()
	c.heldCount(2, true)
	c.heldRetry(2, "failed alone", time.Hour)
	c.look("retried after adoption")
}

// Every fenced write after the lease ended by end: another member took
// it over, or it expired.
func fencedWritesAfter(c *script, end func()) {
	c.inTx(false, "hold and move", func(tx pgx.Tx) error {
		if err := c.heldInsert(tx, consumer.Hold{Seq: 1, Key: "a", Attempts: 1, Err: "nacked"}); err != nil {
			return err
		}
		return c.advance(tx, 1)
	})
	c.heldCount(1, true)
	c.read(1, 2, true, true, false)
	c.look("before")
	end()
	c.read(1, 2, true, false, true)
	c.advance(nil, 2)
	c.advanceRelaxed(2)
	c.retry(nil, "late", time.Hour)
	c.undo(1)
	c.mark(2)
	c.verify(1)
	c.verify(-1)
	c.saveAdaptive("degraded", 1)
	c.heldCount(1, true)
	c.heldUndo(1)
	c.heldRetry(1, "late", time.Hour)
	c.heldRelease(nil, 1)
	c.heldShowFull(true)
	c.heldAdopt()
	c.look("after the writes")
	// A transaction of the core: a failed fenced write rolls it back.
	tx := c.begin()
	c.heldInsert(tx, consumer.Hold{Seq: 2, Key: "b"})
	c.exec(tx, "scan move")
	if c.advance(tx, 2) != nil {
		c.rollback(tx)
	} else {
		c.commit(tx)
	}
	tx = c.begin()
	c.exec(tx, "dead letter")
	if c.heldRelease(tx, 1) != nil {
		c.rollback(tx)
	} else {
		c.commit(tx)
	}
	tx = c.begin()
	if c.retry(tx, "late in tx", 0) != nil {
		c.rollback(tx)
	} else {
		c.commit(tx)
	}
	c.say("lease context: lost %v", errors.Is(context.Cause(c.s.lease.Context()), lease.ErrLeaseLost))
}

// Crash evidence on the cursor row: a holder dies with a batch in flight
// (suspects, nobody charged), with a suspect alone in flight (charged),
// and with a batch in flight again while suspects remain; the counted
// reads, the undo and the cursor moves through the suspects.
func crashEvidence(c *script) {
	c.read(0, 3, true, true, false)
	c.s.lease = c.s.reacquire()
	c.acquired()
	c.look("died with a batch in flight")
	c.read(0, 1, true, false, true)
	c.undo(0)
	c.look("undone")
	c.read(0, 1, true, false, true)
	c.advance(nil, 1)
	c.look("past the first suspect")
	c.read(1, 1, true, false, true)
	c.s.lease = c.s.reacquire()
	c.acquired()
	c.look("died with a suspect alone in flight")
	c.retry(nil, "failed", 0)
	c.read(1, 1, true, false, true)
	c.advance(nil, 3)
	c.look("past the suspects")
	c.read(3, 2, true, true, false)
	c.s.lease = c.s.reacquire()
	c.acquired()
	c.look("died with a batch in flight again")
	c.advance(nil, 4)
	c.read(4, 3, true, true, false)
	c.s.lease = c.s.reacquire()
	c.acquired()
	c.look("died with suspects left")
	c.read(4, 1, true, false, true)
	c.undo(4)
	c.advance(nil, 6)
}

// The savepoints as PostgreSQL stacks them: a release or a rollback to a
// savepoint that does not exist (it was never set, released, or undone
// with an outer one) fails and aborts the transaction; a savepoint set
// again under its name hides the first until released.
func savepointStack(c *script) {
	tx := c.begin()
	c.savepoint(tx, consumer.SavepointNext) // nothing to release
	c.exec(tx, "a")
	c.savepoint(tx, consumer.SavepointRollback)
	c.commit(tx)

	tx = c.begin()
	c.savepoint(tx, consumer.SavepointFirst)
	c.exec(tx, "b")
	c.savepoint(tx, consumer.SavepointFirst)
	c.exec(tx, "c")
	c.savepoint(tx, consumer.SavepointRollback) // c undone
	c.exec(tx, "d")
	c.savepoint(tx, consumer.SavepointRelease)
	c.savepoint(tx, consumer.SavepointRollback) // to the first: d undone
	c.savepoint(tx, consumer.SavepointRelease)
	c.savepoint(tx, consumer.SavepointRelease) // none left
	c.savepoint(tx, consumer.SavepointBatchRollback)
	c.commit(tx)
	c.look("misused")

	tx = c.begin()
	c.savepoint(tx, consumer.SavepointBatch)
	c.savepoint(tx, consumer.SavepointFirst)
	c.exec(tx, "e")
	c.savepoint(tx, consumer.SavepointNext)
	c.exec(tx, "f")
	c.savepoint(tx, consumer.SavepointBatchRollback) // e and f undone, the delivery savepoint gone
	c.savepoint(tx, consumer.SavepointRelease)
	c.savepoint(tx, consumer.SavepointBatchRollback)
	c.exec(tx, "g")
	c.savepoint(tx, consumer.SavepointBatchRelease)
	c.exec(tx, "h")
	c.commit(tx) // g and h

	tx = c.begin()
	c.savepoint(tx, consumer.SavepointBatch)
	c.savepoint(tx, consumer.SavepointBatchRelease)
	c.savepoint(tx, consumer.SavepointBatchRelease)
	c.savepoint(tx, consumer.SavepointBatchRollback)
	c.exec(tx, "i")
	c.commit(tx)
}
