package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/warnlog"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// outcome is how the delivery of a message ended.
type outcome int

const (
	acked outcome = iota
	nacked
	rejected
	stopped  // the lease or the subscription ended before an answer
	timedOut // no answer within HandlerTimeout (Transactional: the transaction must be given up)
	broken   // the handler left the transaction unusable (Transactional)
	isolate  // a batch handler of several messages timed out, or (key isolation) the failing message must be the head of a batch: retry smaller
)

// handled is what handing a batch out came to: how many entries from the
// start are done, and how the next one (if any) ended.
type handled struct {
	done    int
	outcome outcome // of entries[done], when done < len(entries); acked otherwise
	reason  error
	// via takes a rejected message out: the RejectHandler of the
	// delivery's RejectTo, or the Subscriber's.
	via RejectHandler
	// last is the message last handed out: its metadata, as the handler
	// and middleware left them, go with a rejection.
	last *message.Message
	// handedOut: the first message reached the handler.
	handedOut bool
	// dbErr is a database failure met while handing out (the connection
	// lost, say): not the message's, nothing is charged.
	dbErr error
}

// handle hands entries out after taking out a message whose payload is
// missing: the batch ends before it, and when it is the first, it fails
// without being handed out (a counted attempt, and after MaxAttempts a dead
// letter; sentinel.ErrPayloadMissing).
func (w *Worker) handle(ctx context.Context, entries []Entry, tx *txGuard) handled {
	for i, e := range entries {
		if !e.PayloadMissing {
			continue
		}
		if i > 0 {
			return w.handOut(ctx, entries[:i], tx, w.markInFlight)
		}
		reason := &outboxtype.PayloadMissingError{Topic: w.topic, Partition: w.part, Seq: e.Seq}
		w.logger.Error("Message cannot be delivered: its payload is missing; counted as a failed attempt", reason, watermill.LogFields{"seq": e.Seq, "attempt": w.ledger.deliveries})
		w.answered()
		h := handled{}
		h.outcome, h.via, h.reason = w.answer(&delivery{}, nacked, reason)
		if h.outcome == rejected {
			w.countRejected()
		}
		return h
	}
	return w.handOut(ctx, entries, tx, w.markInFlight)
}

// handOut gives the batch to the subscription: one message at a time over
// the channel (mark records each after the first as in flight before it is
// handed out), or all at once to a BatchHandler. With tx (Transactional) it
// keeps the done prefix's writes and undoes the rest with savepoints, and
// checks after every ack that the handler left the transaction usable.
func (w *Worker) handOut(ctx context.Context, entries []Entry, tx *txGuard, mark func(context.Context, int64) error) handled {
	if w.batch != nil {
		return w.handleBatch(ctx, entries, tx)
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	var h handled
	for i, e := range entries {
		if i > 0 {
			w.answered()
			if err := mark(ctx, e.Seq); err != nil {
				if !leaseEnded(err) && ctx.Err() == nil {
					h.dbErr = err
				}
				h.done, h.outcome = i, stopped
				return h
			}
		}
		if tx != nil {
			// Release the previous message's savepoint (which fails if its
			// handler aborted the transaction) and set this one's, in one
			// round trip.
			op := SavepointFirst
			if i > 0 {
				op = SavepointNext
			}
			if err := w.s.Store.Savepoint(dctx, tx.tx, op); err != nil {
				if i > 0 && !connLost(tx) {
					return w.brokenTx(dctx, tx, h, entries, i-1, err)
				}
				h.dbErr, h.done, h.outcome = err, i, stopped
				return h
			}
		}
		got, via, reason := w.deliver(ctx, e, tx, &h)
		if got == stopped && i == 0 && !h.handedOut {
			w.undoDelivery(ctx)
		}
		if got != stopped && got != timedOut {
			w.answered()
		}
		if got == acked && tx != nil {
			if what := tx.takeMisuse(); what != "" {
				got, via, reason = w.answer(&delivery{}, nacked, &outboxtype.TxMisuseError{Seq: e.Seq, What: what})
			}
		}
		if got == acked {
			continue
		}
		if tx != nil && (got == nacked || got == rejected) {
			// Undo whatever the handler wrote for this message.
			if err := w.s.Store.Savepoint(dctx, tx.tx, SavepointRollback); err != nil {
				if connLost(tx) {
					h.dbErr, h.done, h.outcome = err, i, stopped
					return h
				}
				h.done, h.outcome, h.reason = i, broken, &outboxtype.TxMisuseError{Seq: e.Seq, What: misuseEnded, Cause: err}
				return h
			}
		}
		h.done, h.outcome, h.reason, h.via = i, got, reason, via
		return h
	}
	if tx != nil {
		if err := w.s.Store.Savepoint(dctx, tx.tx, SavepointRelease); err != nil {
			if connLost(tx) {
				h.dbErr, h.done, h.outcome = err, len(entries)-1, stopped
				return h
			}
			return w.brokenTx(dctx, tx, h, entries, len(entries)-1, err)
		}
	}
	h.done, h.outcome = len(entries), acked
	return h
}

// connLost reports whether the transaction's connection is gone (a server
// restart, a network failure): a failed statement is then no fault of the
// handler's, and the batch fails as a database error, not a counted attempt.
func connLost(tx *txGuard) bool {
	c := tx.tx.Conn()
	return c != nil && c.IsClosed()
}

// brokenTx handles a savepoint statement that failed after the handler of
// entries[at] acked: the handler aborted or ended the transaction. It rolls
// back to that message's savepoint and fails it (a counted attempt), or,
// when even that fails, reports the transaction broken.
func (w *Worker) brokenTx(ctx context.Context, tx *txGuard, h handled, entries []Entry, at int, cause error) handled {
	e := entries[at]
	h.done = at
	if err := w.s.Store.Savepoint(ctx, tx.tx, SavepointRollback); err != nil {
		if connLost(tx) {
			h.dbErr, h.outcome = err, stopped
			return h
		}
		h.outcome, h.reason = broken, &outboxtype.TxMisuseError{Seq: e.Seq, What: misuseEnded, Cause: cause}
		return h
	}
	w.ledger.attemptOf(e.Seq)
	h.outcome, h.via, h.reason = w.answer(&delivery{}, nacked, &outboxtype.TxMisuseError{Seq: e.Seq, What: misuseAborted, Cause: cause})
	return h
}

// deliver hands one message to the subscription's channel and waits for its
// Ack or Nack, at most HandlerTimeout. With tx (Transactional) the handler
// finds the transaction in the message context. It notes in h that the
// message was handed out, and which.
func (w *Worker) deliver(ctx context.Context, e Entry, tx *txGuard, h *handled) (got outcome, via RejectHandler, reason error) {
	msg, d, cancel := w.newMessage(ctx, e, tx, w.ledger.attemptOf(e.Seq))
	defer cancel() // a message's context ends with its Ack or Nack
	start := time.Now()
	defer func() { w.observe(d.span, got, reason, 1, 0, time.Since(start)) }()
	h.last = msg

	select {
	case w.out <- msg:
		h.handedOut = true
	case <-ctx.Done():
		return stopped, nil, nil
	}
	// One timer per worker, not per message (the hot path); since Go 1.23
	// Reset and Stop leave no stale tick in its channel.
	if w.timer == nil {
		w.timer = time.NewTimer(w.abandonAfter)
	} else {
		w.timer.Reset(w.abandonAfter)
	}
	timeout := w.timer
	defer timeout.Stop()
	done := ctx.Done()
	var grace <-chan time.Time
	for {
		select {
		case <-msg.Acked():
			return w.answer(d, acked, nil)
		case <-msg.Nacked():
			return w.answer(d, nacked, nil)
		case <-timeout.C:
			select { // an answer that raced with the timer wins
			case <-msg.Acked():
				return w.answer(d, acked, nil)
			case <-msg.Nacked():
				return w.answer(d, nacked, nil)
			default:
			}
			cancel()
			// The handler may still be running: it keeps its share of the
			// process's gate until it answers.
			w.abandonGate(msg.Acked(), msg.Nacked())
			timeoutErr := &outboxtype.HandlerTimeoutError{Seq: e.Seq, Timeout: w.s.HandlerTimeout}
			w.logger.Error("Handler timed out: the delivery counts as a failed attempt", timeoutErr, watermill.LogFields{"seq": e.Seq, "attempt": w.ledger.deliveries})
			if tx != nil {
				// The transaction is given up: a rejection, if this was
				// its last attempt, comes after that (counted as one).
				if w.ledger.exhausted() {
					return timedOut, nil, w.ledger.poison(timeoutErr)
				}
				return timedOut, nil, timeoutErr
			}
			return w.answer(d, nacked, timeoutErr)
		case <-done:
			// The lease is ending: give the handler a moment to answer.
			done = nil
			grace = time.After(w.s.CloseTimeout)
		case <-grace:
			w.abandonGate(msg.Acked(), msg.Nacked())
			return stopped, nil, nil
		}
	}
}

// answer turns an Ack, a Nack or a failure (reason) of the message the
// ledger follows into an outcome: a Reject wins over all of them, and a
// message that failed MaxAttempts times is rejected. via is the
// RejectHandler of a rejection.
func (w *Worker) answer(d *delivery, got outcome, reason error) (outcome, RejectHandler, error) {
	isRejected, via, cause := d.rejection()
	if got == nacked || isRejected {
		w.ledger.failed(time.Now())
	}
	if via == nil {
		via = w.s.RejectHandler
	}
	canReject := via != nil
	switch {
	case isRejected && canReject:
		return rejected, via, cause
	case isRejected:
		warnlog.Warn("Message rejected but no RejectHandler is configured: retrying it (set SubscriberConfig.RejectHandler, e.g. a deadletter.Store, or reject with outbox.RejectTo)", watermill.LogFields{"seq": w.ledger.seq, "reason": cause}, w.logger)
		return nacked, nil, cause
	case got == nacked && canReject && isExhausted(reason):
		return rejected, via, reason // (a timed-out Transactional delivery, already found exhausted)
	case got == nacked && canReject && w.ledger.exhausted():
		return rejected, via, w.ledger.poison(reason)
	}
	return got, via, reason
}

// newMessage builds the Watermill message for a log entry, with the
// outbox metadata and a context that carries the delivery handle (and the
// transaction, for the Transactional strategy) and ends at HandlerTimeout.
// cancel ends the context. The worker's stop (Close, the Run context,
// the lease ending) does not end it: the handler gets CloseTimeout to
// answer, and its context ends when the worker gives up waiting (handled).
func (w *Worker) newMessage(ctx context.Context, e Entry, tx *txGuard, attempt int) (*message.Message, *delivery, context.CancelFunc) {
	if tx != nil {
		ctx = pgexec.WithTx(ctx, pgx.Tx(tx))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.s.HandlerTimeout)
	msg, d := w.buildMessage(ctx, e, attempt)
	return msg, d, cancel
}

// buildMessage builds the Watermill message for a log entry on a context
// that already carries the transaction or deadline; it adds the delivery
// handle.
func (w *Worker) buildMessage(ctx context.Context, e Entry, attempt int) (*message.Message, *delivery) {
	msg := message.NewMessage(e.UUID, e.Payload)
	for k, v := range e.Metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(MetadataTopic, w.topic)
	msg.Metadata.Set(MetadataPartition, strconv.Itoa(w.part))
	msg.Metadata.Set(MetadataSeq, strconv.FormatInt(e.Seq, 10))
	msg.Metadata.Set(MetadataAttempt, strconv.Itoa(attempt))
	msg.Metadata.Set(MetadataID, StableID(w.topic, w.part, e.Seq))
	if w.incarnation != "" {
		msg.Metadata.Set(MetadataIncarnation, w.incarnation)
	}
	if e.Key != "" {
		msg.Metadata.Set(MetadataPartitionKey, e.Key)
	}
	if !e.PublishedAt.IsZero() {
		msg.Metadata.Set(MetadataPublishedAt, e.PublishedAt.UTC().Format(time.RFC3339Nano))
	}
	if !e.SequencedAt.IsZero() {
		msg.Metadata.Set(MetadataSequencedAt, e.SequencedAt.UTC().Format(time.RFC3339Nano))
	}
	d := &delivery{token: w.lease.Token()}
	if rec, ok := w.lease.(WriterRecord); ok {
		d.writer = rec
	}
	ctx, d.span = observe.StartProcess(ctx, msg, w.spanName, w.spanAttrs, e.Seq, msg.Metadata.Get(MetadataID), attempt)
	msg.SetContext(context.WithValue(ctx, deliveryKey{}, d))
	return msg, d
}

// errNotReached ends the trace span of a batch's message after the one
// that failed: it was not handled, and comes again.
var errNotReached = errors.New("outbox: not handled: a message before it in the batch failed")

// errStopped ends the trace span of a delivery that got no answer before
// its lease or subscription ended.
var errStopped = errors.New("outbox: delivery stopped before an answer: it is delivered again")

// observe reports how a delivery ended: to the metrics observer (acked
// messages before it in the same handler call, then this outcome) and to
// its trace span. A delivery that stopped (lease or subscription ended)
// has no outcome: it is delivered again.
func (w *Worker) observe(span *observe.Span, got outcome, err error, n, ackedBefore int, took time.Duration) {
	var o observe.Outcome
	switch got {
	case acked:
		o = observe.Ack
	case rejected:
		o = observe.Reject
	case timedOut, isolate:
		o = observe.Timeout
		if isExhausted(err) {
			o = observe.Reject // dead-lettered once the transaction is given up
		}
	case nacked, broken:
		o = observe.Nack
		if errors.Is(err, sentinel.ErrHandlerTimeout) {
			o = observe.Timeout
		}
	default:
		span.End(errStopped)
		return
	}
	if c := w.s.Counts; c != nil {
		c.Acked.Add(int64(ackedBefore))
		switch o {
		case observe.Ack:
			c.Acked.Add(int64(n))
		case observe.Nack:
			c.Nacked.Add(int64(n))
		case observe.Reject:
			c.Rejected.Add(int64(n))
		case observe.Timeout:
			c.TimedOut.Add(int64(n))
		}
	}
	if observe.Enabled() {
		obs := observe.Current()
		if ackedBefore > 0 {
			obs.Delivered(w.s.Group, w.topic, observe.Ack, ackedBefore, took)
		}
		obs.Delivered(w.s.Group, w.topic, o, n, took)
	}
	if o == observe.Ack {
		err = nil
	} else if err == nil {
		err = errors.New("outbox: " + string(o))
	}
	span.End(err)
}

// countRejected counts a message taken out of the stream without a
// delivery of its own to observe (its last delivery ended without an
// outcome, or it could not be delivered at all): every dead-lettering is a
// rejection in the metrics and the Subscriber's counts.
func (w *Worker) countRejected() {
	if c := w.s.Counts; c != nil {
		c.Rejected.Add(1)
	}
	if observe.Enabled() {
		observe.Current().Delivered(w.s.Group, w.topic, observe.Reject, 1, 0)
	}
}

// markInFlight records the message at seq, after the head of a batch
// delivered one at a time, as the partition's delivery in flight, taking a
// share of the process's gate first. Outside careful mode the read
// recorded the whole batch, and it only takes the share.
func (w *Worker) markInFlight(ctx context.Context, seq int64) error {
	if err := w.takeShare(ctx); err != nil {
		return gateError(ctx, err)
	}
	if !w.marksEach() {
		return nil
	}
	ok, err := w.s.Store.MarkInFlight(ctx, w.topic, w.lease, seq)
	if err != nil || ok {
		return err
	}
	return w.lease.Verify(ctx, "record a delivery in flight", -1)
}

// errorOf keeps a handler's error for a batch that fails without one.
func errorOf(done, n int, err error) error {
	if err == nil {
		err = fmt.Errorf("batch handler finished %d of %d messages without an error", done, n)
	}
	return err
}
