package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/pgtext"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// The held keys of key isolation are served at the start of every turn
// (isolatedTurn): their due retries, head first, and the operators'
// requests.

// loadHeld reads the partition's held messages (a new lease holder first
// settles the retries the last one left in flight).
func (w *Worker) loadHeld(ctx context.Context) error {
	iso := w.iso
	if !iso.loaded {
		if err := w.s.Store.HeldAdopt(ctx, w.topic, w.lease); err != nil {
			return err
		}
	}
	rows, err := w.s.Store.HeldLoad(ctx, w.topic, w.part)
	if err != nil {
		return err
	}
	units, byKey := []*heldUnit(nil), map[string]*heldUnit{}
	for _, r := range rows {
		if u := byKey[r.Key]; !r.Keyless && u != nil {
			u.seqs = append(u.seqs, r.Seq)
			u.suspect = u.suspect || r.Suspect
			continue
		}
		u := &heldUnit{key: r.Key, keyless: r.Keyless, seqs: []int64{r.Seq}, attempts: r.Attempts, deliveries: r.Deliveries,
			lastError: r.LastError, requested: r.Requested, suspect: r.Suspect}
		if r.FirstFailure != nil {
			u.firstFailure = *r.FirstFailure
		}
		if r.RetryAt != nil {
			u.retryAt = *r.RetryAt
		}
		units = append(units, u)
		if !r.Keyless {
			byKey[r.Key] = u
		}
	}
	iso.units, iso.byKey, iso.messages = units, byKey, len(rows)
	iso.loaded, iso.loadedAt = true, time.Now()
	iso.parking = nil
	return nil
}

// serveHeld runs at the start of a turn: it reloads the held state when
// due, carries out the operators' requests and retries the heads whose
// retry is due, each key until it fails again or holds nothing. stop
// reports that the turn ends here (lease lost, database error).
func (w *Worker) serveHeld(ctx context.Context) (stop bool, err error) {
	iso := w.iso
	if !iso.loaded || (len(iso.units) > 0 && time.Since(iso.loadedAt) >= heldReloadEvery) {
		if err := w.loadHeld(ctx); err != nil {
			return true, err
		}
	}
	budget := w.mode.BatchSize()
	for _, u := range append([]*heldUnit(nil), iso.units...) {
		if u.requested == "dead_letter" && w.s.RejectHandler != nil {
			if err := w.deadLetterUnit(ctx, u); err != nil {
				if w.heldFailed(ctx, u, err) {
					return true, err
				}
			}
			continue
		}
		if u.requested == "dead_letter" && !w.iso.warnedNoReject {
			w.iso.warnedNoReject = true
			w.logger.Error("Cannot dead-letter a held key as requested: this Subscriber has no RejectHandler; it keeps retrying the key", nil, watermill.LogFields{
				"key": u.key, "seq": u.seqs[0], "hint": "run a member with SubscriberConfig.RejectHandler (e.g. a deadletter.Store)"})
		}
		for budget > 0 && len(u.seqs) > 0 && !time.Now().Before(u.retryAt) {
			progressed, err := w.retryHead(ctx, u, &budget)
			if ctx.Err() != nil {
				return true, nil
			}
			if err != nil {
				if w.heldFailed(ctx, u, err) {
					return true, err
				}
				break
			}
			if !progressed {
				break
			}
		}
	}
	if iso.full && len(iso.units) < iso.cfg.MaxHeldKeys && iso.messages < iso.cfg.MaxHeldMessages {
		w.setFull(ctx, false)
	}
	return false, nil
}

// heldFailed handles an error met while serving held key u that is not the
// message's (a database error, a held message missing from the log): the
// key waits out a backoff, visible in the status as it is, and the error is
// logged; the rest of the partition goes on. stop reports an error that
// ends the turn: the lease is gone.
func (w *Worker) heldFailed(ctx context.Context, u *heldUnit, err error) (stop bool) {
	if leaseEnded(err) || ctx.Err() != nil {
		return true
	}
	delay := w.heldBackoff(u.attempts + 1)
	u.retryAt = time.Now().Add(delay)
	w.logger.Error("Cannot serve a held key, retrying it later; the partition goes on", err, watermill.LogFields{
		"key": u.key, "seq": u.seqs[0], "retry_in": delay})
	return false
}

// forget removes the first n held seqs of u (released: acked or dead
// lettered); the next becomes the head, due at once.
func (iso *isolation) forget(u *heldUnit, n int) {
	for _, s := range u.seqs[:n] {
		delete(u.entries, s)
	}
	u.seqs = u.seqs[n:]
	iso.messages -= n
	u.attempts, u.deliveries, u.lastError, u.firstFailure, u.retryAt = 0, 0, "", time.Time{}, time.Time{}
	if len(u.seqs) > 0 {
		return
	}
	for i, x := range iso.units {
		if x == u {
			iso.units = append(iso.units[:i], iso.units[i+1:]...)
			break
		}
	}
	if !u.keyless {
		delete(iso.byKey, u.key)
	}
}

// heldEntries returns the log entries of u's first n held seqs, reading
// ahead for the retries to come.
func (w *Worker) heldEntries(ctx context.Context, u *heldUnit, n int) ([]Entry, error) {
	n = min(n, len(u.seqs))
	if u.entries == nil {
		u.entries = map[int64]Entry{}
	}
	if _, ok := u.entries[u.seqs[n-1]]; !ok {
		read := u.seqs[:min(len(u.seqs), max(n, 64))]
		entries, err := w.s.Store.ReadSeqs(ctx, w.topic, w.part, read)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			u.entries[e.Seq] = e
		}
	}
	out := make([]Entry, 0, n)
	for _, s := range u.seqs[:n] {
		e, ok := u.entries[s]
		if !ok {
			return nil, fmt.Errorf("outbox: held message %d of topic %q partition %d is no longer in the log", s, w.topic, w.part)
		}
		out = append(out, e)
	}
	return out, nil
}

// retryHead delivers the head of held key u once — counted before hand-out
// on its held row — then releases it (ack), takes it out (Reject,
// MaxAttempts) or gives it its next retry time (failure). progressed
// reports a release. A head that never failed (the messages that waited
// behind one that succeeded) goes with the key's next held messages in one
// batch (Leased strategy), up to budget, which it decreases.
func (w *Worker) retryHead(ctx context.Context, u *heldUnit, budget *int) (progressed bool, err error) {
	n := 1
	if !w.s.Transactional && !u.suspect && u.attempts == 0 && u.deliveries == 0 {
		n = min(64, max(*budget, 1))
	}
	es, err := w.heldEntries(ctx, u, n)
	if err != nil {
		return false, err
	}
	*budget -= len(es)
	e := es[0]
	defer w.releaseGate()
	if err := w.takeHeldGate(ctx, u); err != nil {
		return false, gateError(ctx, err)
	}
	deliveries, ok, err := w.s.Store.HeldCount(ctx, w.topic, w.lease, e.Seq, w.alone())
	if err != nil {
		return false, err
	}
	if !ok {
		// The lease or the row is gone: Verify ends the lease's context if
		// it is the lease; otherwise the next turn reads the rows again.
		w.iso.loaded = false
		_ = w.lease.Verify(ctx, "count a held retry", -1)
		return false, nil
	}
	defer w.borrow(u, e.Seq, deliveries)()
	if w.s.RejectHandler != nil && w.ledger.used() {
		w.ledger.uncount() // this delivery does not happen
		reason := fmt.Errorf("%w: delivered %d times without success (MaxAttempts %d), a crash of its consumer process while it was the only delivery in flight included; last error: %s",
			sentinel.ErrPoison, w.ledger.deliveries, w.s.MaxAttempts, u.lastError)
		return w.rejectHeld(ctx, u, es[:1], reason, w.s.RejectHandler)
	}
	if w.s.Transactional {
		return w.retryHeadInTx(ctx, u, e)
	}
	h := w.handOut(ctx, es, nil, w.markHeld)
	if h.done > 0 {
		dctx, cancel := dbContext(ctx)
		defer cancel()
		seqs := make([]int64, h.done)
		for i := range seqs {
			seqs[i] = es[i].Seq
		}
		if err := w.releaseHeld(dctx, nil, seqs); err != nil {
			return false, err
		}
		w.iso.forget(u, h.done)
		if h.done == len(es) {
			return true, nil
		}
	}
	return w.settleHeld(ctx, u, es[h.done], h)
}

// retryHeadInTx is retryHead's delivery for the Transactional strategy: the
// handler runs in a transaction that releases the held row when it acks.
func (w *Worker) retryHeadInTx(ctx context.Context, u *heldUnit, e Entry) (bool, error) {
	sc, err := w.openTxScope(ctx)
	if err != nil {
		w.undoHeldCount(ctx, e.Seq)
		return false, err
	}
	defer sc.close(ctx)
	h := w.handOut(ctx, []Entry{e}, sc.g, nil)
	if h.dbErr != nil {
		w.undoHeldCount(ctx, e.Seq)
		return false, h.dbErr
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	switch h.outcome {
	case timedOut, broken, isolate:
		sc.giveUp(ctx, w, h)
		h.outcome, h.via, h.reason = w.answer(&delivery{}, nacked, h.reason)
		return w.settleHeld(ctx, u, e, h)
	case stopped:
		return w.settleHeld(ctx, u, e, h)
	case acked:
		if err := w.releaseHeld(dctx, sc.tx, []int64{e.Seq}); err != nil {
			return false, err
		}
	case rejected:
		if err := h.via.HandleReject(dctx, sc.tx, w.rejectedMessage(e, h.reason, h.last)); err != nil {
			return false, fmt.Errorf("outbox: reject handler: %w", err)
		}
		if err := w.releaseHeld(dctx, sc.tx, []int64{e.Seq}); err != nil {
			return false, err
		}
	default: // nacked: the savepoint undid the handler's writes
		return w.settleHeld(ctx, u, e, h)
	}
	sc.finished = true
	if err := sc.tx.Commit(dctx); err != nil {
		return false, err
	}
	w.iso.forget(u, 1)
	return true, nil
}

// settleHeld records how a held retry ended, outside any transaction.
func (w *Worker) settleHeld(ctx context.Context, u *heldUnit, e Entry, h handled) (bool, error) {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	switch h.outcome {
	case acked:
		if err := w.releaseHeld(dctx, nil, []int64{e.Seq}); err != nil {
			return false, err
		}
		w.iso.forget(u, 1)
		return true, nil
	case rejected:
		return w.rejectHeld(ctx, u, []Entry{e}, h.reason, h.via)
	case stopped:
		if !h.handedOut {
			w.undoHeldCount(ctx, e.Seq)
		}
		return false, nil
	}
	reason := h.reason
	if reason == nil {
		reason = errors.New("nacked")
	}
	attempt := w.attemptsOf(e.Seq)
	delay := w.heldBackoff(u.attempts + 1)
	text := pgtext.Clean(fmt.Sprintf("seq %d, attempt %d: %v", e.Seq, attempt, reason), maxErrorText)
	ok, err := w.s.Store.HeldRetry(dctx, w.topic, w.lease, e.Seq, text, delay)
	if err != nil {
		return false, err
	}
	if !ok {
		w.iso.loaded = false
		return false, w.lease.Verify(dctx, "record a held retry", -1)
	}
	u.attempts, u.deliveries, u.lastError, u.retryAt = u.attempts+1, attempt, text, time.Now().Add(delay)
	if u.firstFailure.IsZero() {
		u.firstFailure = time.Now()
	}
	w.logger.Info("Held message failed again", watermill.LogFields{"seq": e.Seq, "key": e.Key, "attempt": attempt, "retry_in": delay, "err": reason})
	return false, nil
}

// releaseHeld deletes held rows, in tx or a statement of its own, fenced
// by the lease.
func (w *Worker) releaseHeld(ctx context.Context, tx pgx.Tx, seqs []int64) error {
	n, err := w.s.Store.HeldRelease(ctx, tx, w.topic, w.lease, seqs)
	if err != nil {
		return err
	}
	if n != len(seqs) {
		w.iso.loaded = false
		if err := w.lease.Verify(ctx, "release held messages", -1); err != nil {
			return err
		}
		return fmt.Errorf("outbox: released %d of %d held messages: the held state changed under the worker", n, len(seqs))
	}
	return nil
}

func (w *Worker) undoHeldCount(ctx context.Context, seq int64) {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if err := w.s.Store.HeldUndoCount(dctx, w.topic, w.lease, seq); err != nil {
		w.logger.Debug("Cannot take back a held retry count", watermill.LogFields{"seq": seq, "err": err})
	}
}

// rejectHeld takes held messages es (the first of u, in order) out through
// via (nil: the Subscriber's RejectHandler) and releases them, in one
// transaction.
func (w *Worker) rejectHeld(ctx context.Context, u *heldUnit, es []Entry, reason error, via RejectHandler) (bool, error) {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if via == nil {
		via = w.s.RejectHandler
	}
	seqs := make([]int64, len(es))
	err := w.s.Store.InTx(dctx, false, func(tx pgx.Tx) error {
		for i, e := range es {
			seqs[i] = e.Seq
			m := w.rejectedMessage(e, reason, nil)
			if i > 0 {
				m.Attempts = 0
			}
			if err := via.HandleReject(dctx, tx, m); err != nil {
				return fmt.Errorf("outbox: reject handler: %w", err)
			}
		}
		return w.releaseHeld(dctx, tx, seqs)
	})
	if err != nil {
		if leaseEnded(err) {
			return false, nil
		}
		return false, err
	}
	w.logger.Error("Held message taken out of the stream", reason, watermill.LogFields{"seq": es[0].Seq, "key": es[0].Key, "messages": len(es)})
	w.iso.forget(u, len(es))
	return true, nil
}

// errDeadLetteredByOperator is the reason given to the RejectHandler for the
// messages of a key an operator dead-lettered (admin.DeadLetterHeld).
var errDeadLetteredByOperator = errors.New("outbox: dead-lettered by an operator while held back with its key (admin.DeadLetterHeld)")

// deadLetterUnit carries out an operator's request to dead-letter every
// held message of u through the Subscriber's RejectHandler (which the
// caller checked is set).
func (w *Worker) deadLetterUnit(ctx context.Context, u *heldUnit) error {
	defer w.borrow(u, u.seqs[0], u.attempts)()
	w.ledger.deadLettering(time.Now())
	for len(u.seqs) > 0 {
		es, err := w.heldEntries(ctx, u, 64)
		if err != nil {
			return err
		}
		reason := fmt.Errorf("%w; last error: %s", errDeadLetteredByOperator, u.lastError)
		if ok, err := w.rejectHeld(ctx, u, es, reason, w.s.RejectHandler); err != nil || !ok {
			return err
		}
		w.ledger.nextUndelivered()
	}
	return nil
}

// takeHeldGate takes the process's delivery gate for a retry of held key
// u: alone when u is a suspect, else a share (see takeGate).
func (w *Worker) takeHeldGate(ctx context.Context, u *heldUnit) error {
	if !u.suspect {
		return w.takeShare(ctx)
	}
	return w.takeAlone(ctx)
}

// markHeld records the held message at seq, after the first of a batch of
// held retries delivered one at a time, as in flight (on its held row),
// taking a share of the process's gate first.
func (w *Worker) markHeld(ctx context.Context, seq int64) error {
	if err := w.takeShare(ctx); err != nil {
		return gateError(ctx, err)
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	_, ok, err := w.s.Store.HeldCount(dctx, w.topic, w.lease, seq, false)
	if err == nil && !ok {
		w.iso.loaded = false
		return w.lease.Verify(dctx, "count a held retry", -1)
	}
	return err
}
