package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/worker"
)

// scope is the transaction a batch is delivered and settled in: none for
// the Leased strategy (leasedScope), the batch's for the Transactional one
// (txScope), where the handlers' writes commit with the cursor. Both
// strategies take the one scan path (scan, settle); their scopes differ in
// what the handlers get and how the outcome is written.
type scope interface {
	// guard is the transaction the handlers get (nil: none).
	guard() *txGuard
	// giveUp gives the transaction up after its handler timed out, broke
	// it or did not answer before the lease ended: the handler may still
	// be using it, or left it unusable. It reports whether there was one.
	giveUp(ctx context.Context, w *Worker, h handled) bool
	// commit records the batch's outcome — the cursor moves to done, past
	// a rejected message, a failure recorded unless the failing message
	// was held — and picks the next step.
	commit(ctx context.Context, w *Worker, b batch, h handled, done int64, held bool) (worker.Directive, error)
	// close ends a transaction that was neither committed nor given up.
	close(ctx context.Context)
}

// openScope opens the scope of the Worker's strategy: for Transactional,
// it begins the batch's transaction.
func (w *Worker) openScope(ctx context.Context) (scope, error) {
	if !w.s.Transactional {
		return leasedScope{}, nil
	}
	return w.openTxScope(ctx)
}

// leasedScope is the Leased strategy's: no transaction around the
// handlers; the outcome is written in statements of its own.
type leasedScope struct{}

func (leasedScope) guard() *txGuard                               { return nil }
func (leasedScope) giveUp(context.Context, *Worker, handled) bool { return false }
func (leasedScope) close(context.Context)                         {}

// txScope is the Transactional strategy's: the batch's transaction.
type txScope struct {
	tx       pgx.Tx
	g        *txGuard // the transaction as the handlers get it
	finished bool     // committed, rolled back or given up
}

// openTxScope begins a batch's transaction.
func (w *Worker) openTxScope(ctx context.Context) (*txScope, error) {
	tx, err := w.s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &txScope{tx: tx, g: newTxGuard(tx)}, nil
}

func (sc *txScope) guard() *txGuard { return sc.g }

func (sc *txScope) close(ctx context.Context) {
	if !sc.finished {
		sc.finished = true
		_ = sc.tx.Rollback(context.WithoutCancel(ctx))
	}
}

func (sc *txScope) giveUp(ctx context.Context, w *Worker, h handled) bool {
	if h.outcome == stopped && !h.handedOut {
		return false // (nothing reached a handler: the done prefix commits)
	}
	sc.finished = true
	if h.outcome == broken {
		_ = sc.tx.Rollback(context.WithoutCancel(ctx))
		return true
	}
	sc.g.abandon(w.s.Tasks, w.s.CloseTimeout, func(err error) {
		w.logger.Error("Cannot roll back the transaction of a timed-out handler", err, watermill.LogFields{"seq": w.cursor + 1})
	})
	return true
}

// settle records how a batch ended and picks the next step: the cursor
// moves past the done prefix (and, with key isolation, past what was held
// or parked), a rejected message goes to its RejectHandler in the same
// transaction, a failure is recorded with its backoff; the Transactional
// strategy does it all in the batch's transaction, which commits, the
// Leased one in statements of its own.
func (w *Worker) settle(ctx context.Context, sc scope, b batch, h handled) (worker.Directive, error) {
	if h.dbErr != nil && sc.guard() != nil {
		// A database failure (the connection was lost, say) is not the
		// message's: its delivery does not count.
		w.undoDelivery(ctx)
		return worker.Idle(), h.dbErr
	}
	switch h.outcome {
	case timedOut, broken, stopped, isolate:
		if sc.giveUp(ctx, w, h) {
			return w.failWholeTx(ctx, b.deliver, h)
		}
		if h.outcome == isolate { // (Leased: a batch handler timed out)
			w.undoDelivery(ctx) // not the head's failure
			w.mode.Rejected(0)
			w.showState(ctx)
			return worker.Proceed(), nil
		}
	}
	done := w.cursor
	if h.done > 0 {
		done = b.deliver[h.done-1].Seq
	}
	held := false
	if w.iso != nil {
		done, held = w.holdFailure(ctx, b, h)
	}
	return sc.commit(ctx, w, b, h, done, held)
}

// commit settles a Leased batch: a rejection with the cursor move past it
// in a transaction of its own (a RejectHandler that fails makes it a
// failure), the cursor move (relaxed), then the failure and its backoff.
func (leasedScope) commit(ctx context.Context, w *Worker, b batch, h handled, done int64, held bool) (worker.Directive, error) {
	if h.outcome == rejected {
		if err := w.rejectInOwnTx(ctx, b.deliver[h.done], h.reason, h.via, h.last); err != nil {
			h.outcome, h.reason = nacked, err
		} else {
			done = b.deliver[h.done].Seq
		}
	}
	if done > w.cursor {
		dctx, cancel := dbContext(ctx)
		defer cancel()
		advance := func() ([]Entry, error) { return nil, w.moveScan(dctx, nil, done) }
		if _, err := w.withBulkhead(dctx, advance); err != nil {
			return worker.Idle(), err
		}
		w.moved(done)
	}
	if h.dbErr != nil {
		return worker.Idle(), h.dbErr // (recording a delivery in flight failed: the rest comes again)
	}
	if held {
		w.showState(ctx)
		return worker.Proceed(), nil
	}
	var delay time.Duration
	if h.outcome == nacked {
		delay = w.noteFailure(h.done)
		if w.iso != nil {
			w.iso.blocked(h.reason, delay)
		}
		w.recordRetry(ctx, nil, w.ledger.failure(h.reason), delay)
	}
	return w.conclude(ctx, h, b.full, delay), nil
}

// commit settles a Transactional batch in its transaction and commits it:
// the rejection, the cursor move and the failure commit together with the
// handlers' writes, or none of them.
func (sc *txScope) commit(ctx context.Context, w *Worker, b batch, h handled, done int64, held bool) (worker.Directive, error) {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	defer w.iso.abandoned() // (after a commit, committed took them)
	if h.outcome == rejected {
		if err := h.via.HandleReject(dctx, sc.tx, w.rejectedMessage(b.deliver[h.done], h.reason, h.last)); err != nil {
			return worker.Idle(), fmt.Errorf("outbox: reject handler: %w", err)
		}
		done = b.deliver[h.done].Seq
	}
	if done > w.cursor {
		if err := w.moveScan(dctx, sc.tx, done); err != nil {
			return worker.Idle(), err
		}
	}
	var delay time.Duration
	retry := h.outcome == nacked && !held
	if retry {
		delay = w.noteFailure(h.done)
		if err := w.lease.RecordRetry(dctx, sc.tx, w.ledger.failure(h.reason), delay); err != nil {
			return worker.Idle(), err
		}
	}
	sc.finished = true
	if err := sc.tx.Commit(dctx); err != nil {
		return worker.Idle(), err
	}
	if retry {
		w.ledger.recorded()
	}
	w.iso.committed()
	w.moved(done)
	if held {
		w.showState(ctx)
		return worker.Proceed(), nil
	}
	if h.outcome == nacked && w.iso != nil {
		w.iso.blocked(h.reason, delay)
	}
	return w.conclude(ctx, h, b.full, delay), nil
}

// conclude feeds a settled batch to the adaptive mode, shows its state and
// picks the next step: at once after a full batch or a rejection, after
// the backoff (delay) after a failure, when poked otherwise.
func (w *Worker) conclude(ctx context.Context, h handled, full bool, delay time.Duration) worker.Directive {
	defer w.showState(ctx)
	switch h.outcome {
	case acked:
		w.mode.Succeeded()
		if full {
			return worker.Proceed()
		}
		return worker.Idle()
	case rejected:
		w.mode.Rejected(h.done)
		return worker.Proceed()
	case nacked:
		return worker.Sleep(delay)
	}
	return worker.Idle() // stopped: the loop ends with the lease
}

// failWholeTx settles a Transactional batch whose transaction was given up
// because of the message at h.done: a timed-out handler, one that broke the
// transaction, or one that never answered before the lease ended. The
// head's failure is a counted attempt (and, after MaxAttempts, a dead
// letter); a later message's is retried in a smaller batch, where it
// becomes the head.
func (w *Worker) failWholeTx(ctx context.Context, entries []Entry, h handled) (worker.Directive, error) {
	switch h.outcome {
	case stopped:
		// The lease is ending; the worker's stop takes the delivery back.
		return worker.Idle(), nil
	case isolate:
		w.undoDelivery(ctx)     // not the head's failure
		w.mode.Rejected(h.done) // (a batch handler that timed out: done is 0)
		w.showState(ctx)
		return worker.Proceed(), nil
	}
	w.logger.Error("Transaction given up", h.reason, watermill.LogFields{"seq": entries[h.done].Seq, "attempt": w.ledger.deliveries})
	if h.done > 0 {
		// The head was done: take its delivery back, and commit the done
		// prefix alone next, so that the failing message becomes the head
		// and is charged for its failures.
		w.undoDelivery(ctx)
		w.mode.Rejected(h.done)
		w.showState(ctx)
		return worker.Proceed(), nil
	}
	reason := h.reason
	got, via, why := w.answer(&delivery{}, nacked, reason)
	if got == rejected {
		err := w.rejectInOwnTx(ctx, entries[0], why, via, h.last)
		switch {
		case err == nil:
			w.mode.Rejected(0)
			w.showState(ctx)
			return worker.Proceed(), nil
		case leaseEnded(err):
			return worker.Idle(), nil
		}
		reason = err
	}
	if w.iso != nil && holdable(why) {
		if w.iso.canHold(entries[0]) {
			return w.holdInOwnTx(ctx, entries[0], why)
		}
		w.setFull(ctx, true)
	}
	delay := w.noteFailure(0)
	w.recordRetry(ctx, nil, w.ledger.failure(reason), delay)
	w.showState(ctx)
	if w.iso != nil {
		w.iso.blocked(why, delay)
	}
	return worker.Sleep(delay), nil
}

// moveScan moves the scan position (the cursor) to done, writing the
// parking rows at or below it in the same transaction: tx, or one of its
// own when tx is nil (then applied to the held state at once; with tx, the
// caller calls iso.committed after its commit). Without rows to write it is
// the usual cursor move: relaxed for the Leased strategy unless
// SyncCursorCommits.
func (w *Worker) moveScan(ctx context.Context, tx pgx.Tx, done int64) error {
	var rows []Hold
	if w.iso != nil {
		for _, r := range w.iso.parking {
			if r.Seq <= done {
				rows = append(rows, r)
			}
		}
		w.iso.parking = rows
	}
	if len(rows) == 0 {
		if tx != nil || w.s.SyncCursorCommits {
			return w.lease.Advance(ctx, tx, done)
		}
		return w.lease.AdvanceRelaxed(ctx, done)
	}
	write := func(tx pgx.Tx) error {
		if err := w.s.Store.HeldInsert(ctx, tx, w.topic, w.part, rows); err != nil {
			return err
		}
		return w.lease.Advance(ctx, tx, done)
	}
	if tx != nil {
		return write(tx)
	}
	// As a relaxed cursor move (Leased): a server crash loses the held rows
	// with the scan move, and the batch comes again.
	relaxed := !w.s.Transactional && !w.s.SyncCursorCommits
	if err := w.s.Store.InTx(ctx, relaxed, write); err != nil {
		w.iso.parking = nil
		return err
	}
	w.iso.committed()
	return nil
}

// recordRetry records a failed attempt of the message the ledger follows
// and when its retry is due, in tx (nil: a statement of its own); best
// effort, logged.
func (w *Worker) recordRetry(ctx context.Context, tx pgx.Tx, cause error, delay time.Duration) {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	err := w.lease.RecordRetry(dctx, tx, cause, delay)
	switch {
	case err == nil:
		w.ledger.recorded()
	case !leaseEnded(err):
		w.logger.Error("Cannot record failure", err, watermill.LogFields{"seq": w.ledger.seq, "attempt": w.ledger.deliveries})
	}
}

// rejectedMessage is what the RejectHandler gets of e: with the metadata of
// last, the message as the handler and middleware left it, when it is e.
func (w *Worker) rejectedMessage(e Entry, reason error, last *message.Message) RejectedMessage {
	metadata := e.Metadata
	if last != nil && last.UUID == e.UUID {
		metadata = make(map[string]string, len(last.Metadata))
		for k, v := range last.Metadata {
			metadata[k] = v
		}
	}
	return RejectedMessage{
		Group:        w.s.Group,
		Topic:        w.topic,
		Partition:    w.part,
		Seq:          e.Seq,
		UUID:         e.UUID,
		PartitionKey: e.Key,
		Metadata:     metadata,
		Payload:      e.Payload,
		Reason:       reason,
		Attempts:     w.ledger.deliveries,
		FirstFailure: w.ledger.first,
		LastFailure:  w.ledger.last,
	}
}

// rejectInOwnTx stores a rejected message through via and moves the cursor
// past it in one transaction of its own.
func (w *Worker) rejectInOwnTx(ctx context.Context, e Entry, reason error, via RejectHandler, last *message.Message) error {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if via == nil {
		via = w.s.RejectHandler
	}
	_, err := w.withBulkhead(dctx, func() ([]Entry, error) {
		return nil, w.s.Store.InTx(dctx, false, func(tx pgx.Tx) error {
			if err := via.HandleReject(dctx, tx, w.rejectedMessage(e, reason, last)); err != nil {
				return fmt.Errorf("outbox: reject handler: %w", err)
			}
			return w.moveScan(dctx, tx, e.Seq)
		})
	})
	if err != nil {
		w.iso.abandoned()
		return err
	}
	w.iso.committed()
	w.moved(e.Seq)
	return nil
}

// holdInOwnTx holds e, whose transaction was given up, and moves the scan
// past it (and what was parked before it) in a transaction of its own.
func (w *Worker) holdInOwnTx(ctx context.Context, e Entry, reason error) (worker.Directive, error) {
	w.hold(e, w.attemptsOf(e.Seq), reason)
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if err := w.moveScan(dctx, nil, e.Seq); err != nil {
		if leaseEnded(err) {
			return worker.Idle(), nil
		}
		return worker.Idle(), err
	}
	w.moved(e.Seq)
	w.showState(ctx)
	return worker.Proceed(), nil
}

// attemptsOf is the attempt number of the last delivery of the message at
// seq (1 unless it is the message the ledger follows).
func (w *Worker) attemptsOf(seq int64) int {
	if seq == w.ledger.seq {
		return max(w.ledger.deliveries, 1)
	}
	return 1
}
