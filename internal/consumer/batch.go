package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// handleBatch gives the whole batch to the BatchHandler (ConsumeBatches).
// With tx, a batch that is not done entirely is undone entirely (its
// writes cannot be split), so nothing of it counts as done; adaptive
// degradation then shrinks the batch until the failing message stands
// alone.
func (w *Worker) handleBatch(ctx context.Context, entries []Entry, tx *txGuard) (h handled) {
	headAttempt := w.ledger.attemptOf(entries[0].Seq)
	msgs := make([]*message.Message, len(entries))
	deliveries := make([]*delivery, len(entries))
	start := time.Now()
	defer func() { w.observeBatch(deliveries, h, time.Since(start)) }()
	// One context for the whole batch: one deadline, and the transaction
	// (Transactional), ended when the batch is done. The worker's stop does
	// not end it: a send in flight gets CloseTimeout to finish (callBatch),
	// then this context ends as handleBatch returns.
	bctx := ctx
	if tx != nil {
		bctx = pgexec.WithTx(ctx, pgx.Tx(tx))
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(bctx), w.s.HandlerTimeout)
	defer cancel()
	for i, e := range entries {
		attempt := 1
		if i == 0 {
			attempt = headAttempt
		}
		msgs[i], deliveries[i] = w.buildMessage(bctx, e, attempt)
	}
	h.last = msgs[0]
	dctx, cancelDB := dbContext(ctx)
	defer cancelDB()
	if tx != nil {
		if err := w.s.Store.Savepoint(dctx, tx.tx, SavepointBatch); err != nil {
			h.dbErr, h.outcome = err, stopped
			return h
		}
	}
	h.handedOut = true
	done, answered, err := w.callBatch(ctx, bctx, msgs)
	switch answered {
	case batchTimedOut:
		cancel()
		reason := &outboxtype.HandlerTimeoutError{Seq: entries[0].Seq, Timeout: w.s.HandlerTimeout}
		if len(entries) > 1 {
			// Which message hung is unknown: retry them one at a time, so
			// that the one that hangs is charged, not the head.
			w.logger.Error("Batch handler timed out: retrying its messages one at a time", reason, watermill.LogFields{"seq": entries[0].Seq, "batch": len(entries)})
			h.outcome, h.reason = isolate, reason
			return h
		}
		w.logger.Error("Batch handler timed out: the delivery counts as a failed attempt", reason, watermill.LogFields{"seq": entries[0].Seq, "attempt": w.ledger.deliveries, "batch": len(entries)})
		if tx != nil {
			h.outcome, h.reason = timedOut, reason
			if w.ledger.exhausted() {
				h.reason = w.ledger.poison(reason)
			}
			return h
		}
		h.outcome, h.via, h.reason = w.answer(&delivery{}, nacked, reason)
		return h
	case batchGaveUp:
		h.outcome = stopped
		return h
	}
	if tx != nil {
		if what := tx.takeMisuse(); what != "" {
			done, err = 0, &outboxtype.TxMisuseError{Seq: entries[0].Seq, What: what}
		} else if done >= len(entries) {
			if rerr := w.s.Store.Savepoint(dctx, tx.tx, SavepointBatchRelease); rerr != nil {
				if connLost(tx) {
					h.dbErr, h.outcome = rerr, stopped
					return h
				}
				done, err = 0, &outboxtype.TxMisuseError{Seq: entries[0].Seq, What: misuseAborted, Cause: rerr}
			}
		}
	}
	if done >= len(entries) {
		h.done, h.outcome = len(entries), acked
		return h
	}
	if ctx.Err() != nil && err == nil {
		err = context.Cause(ctx)
	}
	err = errorOf(done, len(entries), err)
	if tx != nil {
		if rerr := w.s.Store.Savepoint(dctx, tx.tx, SavepointBatchRollback); rerr != nil {
			if connLost(tx) {
				h.dbErr, h.outcome = rerr, stopped
				return h
			}
			h.outcome, h.reason = broken, &outboxtype.TxMisuseError{Seq: entries[0].Seq, What: misuseEnded, Cause: rerr}
			return h
		}
		if done > 0 && w.iso != nil {
			// Commit the done prefix alone next, so that the failing
			// message is the head of a batch, and held back with its key.
			h.done, h.outcome, h.reason = done, isolate, err
			return h
		}
		if done > 0 {
			done = 0
			deliveries[0] = &delivery{} // the head was not the one that failed
		}
	}
	if done == 0 {
		h.outcome, h.via, h.reason = w.answer(deliveries[0], nacked, err)
		return h
	}
	// A message after the head failed: it is retried as the next head, and
	// its failure is the one recorded (the cursor moves to it).
	h.done, h.outcome, h.reason = done, nacked, err
	w.ledger.attemptOf(entries[done].Seq)
	w.ledger.failed(time.Now())
	if rej, via, cause := deliveries[done].rejection(); rej && (via != nil || w.s.RejectHandler != nil) {
		h.last = msgs[done]
		if via == nil {
			via = w.s.RejectHandler
		}
		h.outcome, h.reason, h.via = rejected, cause, via
	}
	return h
}

// observeBatch reports how a batch's deliveries ended (see observe): the
// done prefix acked, the one at done with the batch's outcome, the rest
// not reached.
func (w *Worker) observeBatch(deliveries []*delivery, h handled, took time.Duration) {
	if h.done >= len(deliveries) {
		if c := w.s.Counts; c != nil {
			c.Acked.Add(int64(h.done))
		}
		if observe.Enabled() {
			observe.Current().Delivered(w.s.Group, w.topic, observe.Ack, h.done, took)
		}
	}
	for i, d := range deliveries {
		if d == nil {
			continue
		}
		switch {
		case i < h.done:
			d.span.End(nil)
		case i == h.done:
			w.observe(d.span, h.outcome, h.reason, 1, h.done, took)
		default:
			d.span.End(errNotReached)
		}
	}
}

type batchAnswer int

const (
	batchAnswered batchAnswer = iota
	batchTimedOut             // no return within HandlerTimeout
	batchGaveUp               // no return within CloseTimeout after the lease ended
)

// callBatch runs the BatchHandler on handlerCtx (which ends at
// HandlerTimeout, as its messages' contexts do, and carries the
// Transactional strategy's transaction), turning a panic into an error, and waits
// for it at most HandlerTimeout (and CloseTimeout once the lease ends). A
// handler that does not return in time is left running on its own
// goroutine, which ends when it returns (keeping its share of the
// process's gate until then); its result is ignored.
func (w *Worker) callBatch(ctx, handlerCtx context.Context, msgs []*message.Message) (int, batchAnswer, error) {
	type result struct {
		done int
		err  error
	}
	ch := make(chan result, 1)
	returned := make(chan struct{})
	go func() {
		var r result
		defer func() {
			if v := recover(); v != nil {
				r = result{0, fmt.Errorf("outbox: batch handler panicked: %v", v)}
			}
			ch <- r
			close(returned)
		}()
		done, err := w.batch(handlerCtx, msgs)
		r = result{max(0, min(done, len(msgs))), err}
	}()
	timeout := time.NewTimer(w.abandonAfter)
	defer timeout.Stop()
	stop := ctx.Done()
	var grace <-chan time.Time
	for {
		select {
		case r := <-ch:
			w.answered()
			return r.done, batchAnswered, r.err
		case <-timeout.C:
			select {
			case r := <-ch:
				w.answered()
				return r.done, batchAnswered, r.err
			default:
			}
			w.abandonGate(returned, nil)
			return 0, batchTimedOut, nil
		case <-stop:
			stop = nil
			grace = time.After(w.s.CloseTimeout)
		case <-grace:
			w.abandonGate(returned, nil)
			return 0, batchGaveUp, nil
		}
	}
}
