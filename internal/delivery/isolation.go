package delivery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/pgtext"
	"github.com/millrace/watermill-outbox/internal/worker"
)

// Isolation configures key-level isolation (outbox.KeyIsolation): a
// message that fails is held back with every later message of its key, and
// the partition's other keys go on.
type Isolation struct {
	Enabled bool
	// Bounds per partition; past either, the partition blocks on a failing
	// message as it does without isolation, and says so.
	MaxHeldKeys     int
	MaxHeldMessages int
}

// How the held-back state works. The cursor row's seq is the worker's scan
// position: every message at or below it was delivered or is held (table
// held). A message that fails (nack, timeout, broken transaction) is held
// instead of retried in place, in the transaction that moves the scan past
// it; every later message of its key met by the scan is parked behind it in
// the same way. The held messages of a key are retried from their own rows,
// head first, with the usual backoff, MaxAttempts and Reject rules; when the
// head succeeds or is dead-lettered it leaves the table and the next one of
// the key becomes the head, due at once. A key is free again when it holds
// nothing: its newer messages are all above the scan position, so none can
// overtake an older one. Keyless messages are held alone and park nothing.

// heldUnit is one held key (or one keyless message): its held seqs in order
// and the state of the head's retries.
type heldUnit struct {
	key          string
	keyless      bool
	seqs         []int64
	entries      map[int64]logEntry // read ahead for the retries
	attempts     int
	deliveries   int
	lastError    string
	firstFailure time.Time
	retryAt      time.Time
	requested    string
	// suspect: a retry of one of its messages ended without an outcome
	// while other deliveries were in flight in the same process; its
	// messages are retried one at a time, each alone in the process.
	suspect bool
}

// heldRow is a message to hold, written with the next scan move.
type heldRow struct {
	seq      int64
	key      string
	keyless  bool
	attempts int
	err      string // "" for a message parked behind its key's head
	delay    time.Duration
}

// isolation is a worker's held-back state, mirrored from the held table.
type isolation struct {
	cfg      Isolation
	loaded   bool
	loadedAt time.Time
	units    []*heldUnit // by head seq
	byKey    map[string]*heldUnit
	messages int
	// parking: rows to write with the next scan move (split, hold).
	parking []heldRow
	// full: the bounds stopped a hold or a park (shown on the cursor row).
	full, fullShown bool
	// scanBlockedUntil: the scan's head is backing off (blocking fallback,
	// or the backoff found on the cursor row at acquisition).
	scanBlockedUntil time.Time
	// holdHead: the scan's head failed for reasons of its own without
	// being held (its deliveries ended without an outcome, or the bounds
	// were reached): hold it on the next read if the bounds allow.
	holdHead       bool
	warnedNoReject bool
}

// heldReloadEvery is how often a worker with held keys re-reads them, for
// the operators' requests (admin.RetryHeldNow, DeadLetterHeld).
const heldReloadEvery = time.Second

// maxErrorText bounds the error text stored on a held row.
const maxErrorText = 2000

func newIsolation(cfg Isolation, unanswered int) *isolation {
	if !cfg.Enabled {
		return nil
	}
	return &isolation{cfg: cfg, byKey: map[string]*heldUnit{}, holdHead: unanswered > 0}
}

// blocked records that the scan's head failed without being held: for a
// reason of its own (the bounds stopped the hold) or not (the partition
// blocks on purpose).
func (iso *isolation) blocked(reason error, delay time.Duration) {
	iso.holdHead = holdable(reason)
	iso.scanBlockedUntil = time.Now().Add(delay)
}

// fenceArgs are the parameters every worker statement of held.sql starts
// with.
func (w *Worker) fenceArgs(more ...any) []any {
	return append([]any{w.s.Group, w.topic, w.part, w.lease.Owner(), w.lease.Token()}, more...)
}

// loadHeld reads the partition's held messages (a new lease holder first
// charges retries that ended without an outcome).
func (w *Worker) loadHeld(ctx context.Context) error {
	iso := w.iso
	q := w.s.Store.q
	if !iso.loaded {
		if _, err := w.s.Store.db.Exec(ctx, q.HeldAdopt, w.fenceArgs()...); err != nil {
			return fmt.Errorf("outbox: adopt held messages: %w", err)
		}
	}
	rows, err := w.s.Store.db.Query(ctx, q.HeldLoad, w.s.Group, w.topic, w.part)
	if err != nil {
		return fmt.Errorf("outbox: load held messages: %w", err)
	}
	defer rows.Close()
	units, byKey, messages := []*heldUnit(nil), map[string]*heldUnit{}, 0
	for rows.Next() {
		var (
			seq                       int64
			keyless                   bool
			key, lastError, requested string
			attempts, deliveries      int32
			firstFailure, retryAt     *time.Time
			suspect                   bool
		)
		if err := rows.Scan(&seq, &keyless, &key, &attempts, &deliveries, &lastError, &firstFailure, &retryAt, &requested, &suspect); err != nil {
			return err
		}
		messages++
		if u := byKey[key]; !keyless && u != nil {
			u.seqs = append(u.seqs, seq)
			u.suspect = u.suspect || suspect
			continue
		}
		u := &heldUnit{key: key, keyless: keyless, seqs: []int64{seq}, attempts: int(attempts), deliveries: int(deliveries),
			lastError: lastError, requested: requested, suspect: suspect}
		if firstFailure != nil {
			u.firstFailure = *firstFailure
		}
		if retryAt != nil {
			u.retryAt = *retryAt
		}
		units = append(units, u)
		if !keyless {
			byKey[key] = u
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	iso.units, iso.byKey, iso.messages = units, byKey, messages
	iso.loaded, iso.loadedAt = true, time.Now()
	iso.parking = nil
	return nil
}

// split sorts a batch read after the scan position into the messages to
// deliver and those to park behind their held key (recorded in parking).
// scanEnd is the last seq the scan covers; it stops early (cut) at a
// message it can neither deliver nor park because the bounds are reached.
func (iso *isolation) split(entries []logEntry) (deliver []logEntry, scanEnd int64, cut bool) {
	iso.parking = iso.parking[:0]
	if len(iso.byKey) == 0 {
		return entries, entries[len(entries)-1].seq, false // nothing to park behind
	}
	deliver = entries[:0:0]
	for _, e := range entries {
		if e.key != "" && iso.byKey[e.key] != nil {
			if iso.messages+len(iso.parking)+1 > iso.cfg.MaxHeldMessages {
				return deliver, scanEnd, true
			}
			iso.parking = append(iso.parking, heldRow{seq: e.seq, key: e.key})
		} else {
			deliver = append(deliver, e)
		}
		scanEnd = e.seq
	}
	return deliver, scanEnd, false
}

// holdable says whether a failure is the message's own, so that holding
// its key back lets the others go on.
func holdable(reason error) bool { return !errors.Is(reason, errs.ErrNotKeySpecific) }

// canHold says whether e can be held as the head of a new held key.
func (iso *isolation) canHold(e logEntry) bool {
	return len(iso.units)+1 <= iso.cfg.MaxHeldKeys && iso.messages+len(iso.parking)+1 <= iso.cfg.MaxHeldMessages
}

// hold adds e, which failed its attempts-th delivery with reason, to the
// rows written with the next scan move, as the head of a new held key.
func (w *Worker) hold(e logEntry, attempts int, reason error) {
	if reason == nil {
		reason = errors.New("nacked")
	}
	delay := w.heldBackoff(attempts)
	text := pgtext.Clean(fmt.Sprintf("seq %d, attempt %d: %v", e.seq, attempts, reason), maxErrorText)
	w.iso.parking = append(w.iso.parking, heldRow{seq: e.seq, key: e.key, keyless: e.key == "", attempts: attempts, err: text, delay: delay})
	w.logger.Error("Message failed: held back with its key while the partition goes on", reason, watermill.LogFields{
		"seq": e.seq, "key": e.key, "attempt": attempts, "retry_in": delay})
}

// heldBackoff is the delay before the retry that follows a held head's
// attempts-th failure: the Tuning's exponential backoff, with jitter.
func (w *Worker) heldBackoff(attempts int) time.Duration {
	return jitter(adaptive.ExponentialBackoff(w.s.Tuning.BackoffBase, w.s.Tuning.BackoffMax, max(attempts, 1)))
}

// moveScan moves the scan position to done, writing the parking rows at
// or below it in the same transaction: q, or one of its own when q is nil
// (then applied to the held state at once; with q, the caller calls
// iso.committed after its commit). Without rows to write it is the usual
// cursor move.
func (w *Worker) moveScan(ctx context.Context, q pgexec.Querier, done int64) error {
	var rows []heldRow
	if w.iso != nil {
		for _, r := range w.iso.parking {
			if r.seq <= done {
				rows = append(rows, r)
			}
		}
		w.iso.parking = rows
	}
	if len(rows) == 0 {
		switch {
		case q != nil:
			return w.lease.Advance(ctx, q, done)
		case w.s.SyncCursorCommits:
			return w.lease.Advance(ctx, w.s.Store.DB(), done)
		default:
			return w.lease.AdvanceRelaxed(ctx, done)
		}
	}
	write := func(q pgexec.Querier) error {
		n := len(rows)
		seqs, keys, attempts, errTexts, delays := make([]int64, n), make([]*string, n), make([]int32, n), make([]*string, n), make([]int64, n)
		for i, r := range rows {
			seqs[i], attempts[i], delays[i] = r.seq, int32(r.attempts), r.delay.Microseconds()
			if !r.keyless {
				keys[i] = &rows[i].key
			}
			if r.err != "" {
				errTexts[i] = &rows[i].err
			}
		}
		if _, err := q.Exec(ctx, w.s.Store.q.HeldInsert, w.s.Group, w.topic, w.part, seqs, keys, attempts, errTexts, delays); err != nil {
			return fmt.Errorf("outbox: hold messages back: %w", err)
		}
		return w.lease.Advance(ctx, q, done)
	}
	if q != nil {
		return write(q)
	}
	err := w.s.Store.InTx(ctx, func(tx pgx.Tx) error {
		q, _ := pgexec.FromTx(tx)
		if !w.s.Transactional && !w.s.SyncCursorCommits {
			// As a relaxed cursor move: a server crash loses the held rows
			// with the scan move, and the batch comes again.
			if _, err := q.Exec(ctx, w.s.Store.q.TxRelaxedCommit); err != nil {
				return err
			}
		}
		return write(q)
	})
	if err != nil {
		w.iso.parking = nil
		return err
	}
	w.iso.committed()
	return nil
}

// committed applies the parking rows written by a committed scan move.
func (iso *isolation) committed() {
	if iso == nil {
		return
	}
	for _, r := range iso.parking {
		iso.messages++
		if u := iso.byKey[r.key]; !r.keyless && u != nil {
			u.seqs = append(u.seqs, r.seq)
			continue
		}
		u := &heldUnit{key: r.key, keyless: r.keyless, seqs: []int64{r.seq}, attempts: r.attempts, deliveries: r.attempts,
			lastError: r.err, firstFailure: time.Now(), retryAt: time.Now().Add(r.delay)}
		iso.units = append(iso.units, u)
		if !r.keyless {
			iso.byKey[r.key] = u
		}
	}
	iso.parking = nil
}

// abandoned forgets parking rows whose transaction did not commit.
func (iso *isolation) abandoned() {
	if iso != nil {
		iso.parking = nil
	}
}

// setFull records (and shows on the cursor row, best effort) whether the
// bounds keep the partition from isolating a failing key.
func (w *Worker) setFull(ctx context.Context, full bool) {
	iso := w.iso
	if full && !iso.full {
		w.logger.Error("Key isolation bounds reached: the partition blocks on its failing message as without isolation", nil, watermill.LogFields{
			"held_keys": len(iso.units), "held_messages": iso.messages, "max_held_keys": iso.cfg.MaxHeldKeys, "max_held_messages": iso.cfg.MaxHeldMessages,
			"hint": "fix or dead-letter the held keys (admin.DeadLetterHeld), or raise KeyIsolation.MaxHeldKeys / MaxHeldMessages"})
	}
	iso.full = full
	if iso.fullShown == full {
		return
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if _, err := w.s.Store.db.Exec(dctx, w.s.Store.q.HeldShowFull, w.fenceArgs(full)...); err != nil {
		w.logger.Debug("Cannot show the isolation bounds state", watermill.LogFields{"err": err})
		return
	}
	iso.fullShown = full
	if !full {
		w.logger.Info("Key isolation is back: held keys are under the bounds again", watermill.LogFields{"held_keys": len(iso.units), "held_messages": iso.messages})
	}
}

// wake shortens an Idle or a Sleep so that the next due held retry (and the
// next reload of the held state) is not missed.
func (w *Worker) wake(dir worker.Directive) worker.Directive {
	iso := w.iso
	if iso == nil || len(iso.units) == 0 || dir == worker.Proceed() {
		return dir
	}
	next := heldReloadEvery
	for _, u := range iso.units {
		next = min(next, max(time.Until(u.retryAt), 0))
	}
	if dir == worker.Idle() {
		return worker.IdleFor(next)
	}
	if d, ok := dir.SleepDelay(); ok && d > next {
		return worker.Sleep(next)
	}
	return dir
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
func (w *Worker) heldEntries(ctx context.Context, u *heldUnit, n int) ([]logEntry, error) {
	n = min(n, len(u.seqs))
	if u.entries == nil {
		u.entries = map[int64]logEntry{}
	}
	if _, ok := u.entries[u.seqs[n-1]]; !ok {
		read := u.seqs[:min(len(u.seqs), max(n, 64))]
		rows, err := w.s.Store.db.Query(ctx, w.s.Store.q.LogReadSeqs, w.topic, w.part, read)
		if err != nil {
			return nil, err
		}
		entries, _, err := scanEntries(rows, len(read))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			u.entries[e.seq] = e
		}
	}
	out := make([]logEntry, 0, n)
	for _, s := range u.seqs[:n] {
		e, ok := u.entries[s]
		if !ok {
			return nil, fmt.Errorf("outbox: held message %d of topic %q partition %d is no longer in the log", s, w.topic, w.part)
		}
		out = append(out, e)
	}
	return out, nil
}

// headState is the worker's record of the message whose failures it
// counts; a held retry borrows it.
type headState struct {
	seq                       int64
	attempts, charged         int
	firstFailure, lastFailure time.Time
	lastError                 string
}

func (w *Worker) saveHead() headState {
	return headState{w.headSeq, w.attempts, w.charged, w.firstFailure, w.lastFailure, w.lastError}
}

func (w *Worker) restoreHead(h headState) {
	w.headSeq, w.attempts, w.charged, w.firstFailure, w.lastFailure, w.lastError = h.seq, h.attempts, h.charged, h.firstFailure, h.lastFailure, h.lastError
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
	var deliveries int32
	err = pgexec.QueryRow(ctx, w.s.Store.db, w.s.Store.q.HeldCount, w.fenceArgs(e.seq, w.alone()), &deliveries)
	if errors.Is(err, pgx.ErrNoRows) {
		// The lease or the row is gone: Verify ends the lease's context if
		// it is the lease; otherwise the next turn reads the rows again.
		w.iso.loaded = false
		_ = w.lease.Verify(ctx, "count a held retry", -1)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	saved := w.saveHead()
	defer w.restoreHead(saved)
	w.headSeq, w.attempts, w.charged, w.firstFailure, w.lastFailure, w.lastError = e.seq, int(deliveries), u.attempts, u.firstFailure, time.Time{}, u.lastError
	if w.firstFailure.IsZero() {
		w.firstFailure = time.Now()
	}
	if maxAttempts := w.s.MaxAttempts; maxAttempts > 0 && w.s.RejectHandler != nil && u.attempts >= maxAttempts {
		w.attempts-- // this delivery does not happen
		reason := fmt.Errorf("%w: delivered %d times without success (MaxAttempts %d), deliveries that ended without an outcome included; last error: %s",
			errs.ErrPoison, w.attempts, maxAttempts, u.lastError)
		w.rejectVia = w.s.RejectHandler
		return w.rejectHeld(ctx, u, es[:1], reason)
	}
	if w.s.Transactional {
		return w.retryHeadInTx(ctx, u, e)
	}
	processed, result, reason := w.handleMarking(ctx, es, nil, w.markHeld)
	if processed > 0 {
		dctx, cancel := dbContext(ctx)
		defer cancel()
		seqs := make([]int64, processed)
		for i := range seqs {
			seqs[i] = es[i].seq
		}
		if err := w.releaseHeld(dctx, w.s.Store.db, seqs); err != nil {
			return false, err
		}
		w.iso.forget(u, processed)
		if processed == len(es) {
			return true, nil
		}
	}
	return w.settleHeld(ctx, u, es[processed], result, reason)
}

// retryHeadInTx is retryHead's delivery for the Transactional strategy: the
// handler runs in a transaction that releases the held row when it acks.
func (w *Worker) retryHeadInTx(ctx context.Context, u *heldUnit, e logEntry) (bool, error) {
	tx, err := w.s.Store.Begin(ctx)
	if err != nil {
		w.undoHeldCount(ctx, e.seq)
		return false, err
	}
	guard := newTxGuard(tx)
	finished := false
	defer func() {
		if !finished {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	_, result, reason := w.handle(ctx, []logEntry{e}, guard)
	if err := w.takeHandleError(); err != nil {
		w.undoHeldCount(ctx, e.seq)
		return false, err
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	q, _ := pgexec.FromTx(tx)
	switch result {
	case timedOut, broken, isolate:
		finished = true
		if result == broken {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		} else {
			guard.abandon(w.s.Background, w.s.Stop, w.s.CloseTimeout, func(err error) {
				w.logger.Error("Cannot roll back the transaction of a timed-out handler", err, watermill.LogFields{"seq": e.seq})
			})
		}
		result, reason = w.answer(&delivery{}, nacked, e, reason)
		return w.settleHeld(ctx, u, e, result, reason)
	case stopped:
		return w.settleHeld(ctx, u, e, result, reason)
	case acked:
		if err := w.releaseHeld(dctx, q, []int64{e.seq}); err != nil {
			return false, err
		}
	case rejected:
		if err := w.rejectVia.HandleReject(dctx, tx, w.rejectedMessage(e, reason)); err != nil {
			return false, fmt.Errorf("outbox: reject handler: %w", err)
		}
		if err := w.releaseHeld(dctx, q, []int64{e.seq}); err != nil {
			return false, err
		}
	default: // nacked: the savepoint undid the handler's writes
		return w.settleHeld(ctx, u, e, result, reason)
	}
	finished = true
	if err := tx.Commit(dctx); err != nil {
		return false, err
	}
	w.iso.forget(u, 1)
	return true, nil
}

// settleHeld records how a held retry ended, outside any transaction.
func (w *Worker) settleHeld(ctx context.Context, u *heldUnit, e logEntry, result outcome, reason error) (bool, error) {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	switch result {
	case acked:
		if err := w.releaseHeld(dctx, w.s.Store.db, []int64{e.seq}); err != nil {
			return false, err
		}
		w.iso.forget(u, 1)
		return true, nil
	case rejected:
		return w.rejectHeld(ctx, u, []logEntry{e}, reason)
	case stopped:
		if !w.handedOut {
			w.undoHeldCount(ctx, e.seq)
		}
		return false, nil
	}
	if reason == nil {
		reason = errors.New("nacked")
	}
	attempt := w.attemptsOf(e.seq)
	delay := w.heldBackoff(u.attempts + 1)
	text := pgtext.Clean(fmt.Sprintf("seq %d, attempt %d: %v", e.seq, attempt, reason), maxErrorText)
	n, err := w.s.Store.db.Exec(dctx, w.s.Store.q.HeldRetry, w.fenceArgs(e.seq, text, delay.Microseconds())...)
	if err != nil {
		return false, err
	}
	if n == 0 {
		w.iso.loaded = false
		return false, w.lease.Verify(dctx, "record a held retry", -1)
	}
	u.attempts, u.deliveries, u.lastError, u.retryAt = u.attempts+1, attempt, text, time.Now().Add(delay)
	if u.firstFailure.IsZero() {
		u.firstFailure = time.Now()
	}
	w.logger.Info("Held message failed again", watermill.LogFields{"seq": e.seq, "key": e.key, "attempt": attempt, "retry_in": delay, "err": reason})
	return false, nil
}

// releaseHeld deletes held rows in q, fenced by the lease.
func (w *Worker) releaseHeld(ctx context.Context, q pgexec.Querier, seqs []int64) error {
	n, err := q.Exec(ctx, w.s.Store.q.HeldRelease, w.fenceArgs(seqs)...)
	if err != nil {
		return fmt.Errorf("outbox: release held messages: %w", err)
	}
	if int(n) != len(seqs) {
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
	if _, err := w.s.Store.db.Exec(dctx, w.s.Store.q.HeldUndoCount, w.fenceArgs(seq)...); err != nil {
		w.logger.Debug("Cannot take back a held retry count", watermill.LogFields{"seq": seq, "err": err})
	}
}

// rejectHeld takes held messages es (the first of u, in order) out through
// the reject handler and releases them, in one transaction.
func (w *Worker) rejectHeld(ctx context.Context, u *heldUnit, es []logEntry, reason error) (bool, error) {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	via := w.rejectVia
	if via == nil {
		via = w.s.RejectHandler
	}
	seqs := make([]int64, len(es))
	err := w.s.Store.InTx(dctx, func(tx pgx.Tx) error {
		for i, e := range es {
			seqs[i] = e.seq
			m := w.rejectedMessage(e, reason)
			if i > 0 {
				m.Attempts = 0
			}
			if err := via.HandleReject(dctx, tx, m); err != nil {
				return fmt.Errorf("outbox: reject handler: %w", err)
			}
		}
		q, _ := pgexec.FromTx(tx)
		return w.releaseHeld(dctx, q, seqs)
	})
	if err != nil {
		if leaseEnded(err) {
			return false, nil
		}
		return false, err
	}
	w.logger.Error("Held message taken out of the stream", reason, watermill.LogFields{"seq": es[0].seq, "key": es[0].key, "messages": len(es)})
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
	saved := w.saveHead()
	defer w.restoreHead(saved)
	w.headSeq, w.attempts, w.firstFailure, w.lastFailure, w.lastError = u.seqs[0], u.attempts, u.firstFailure, time.Now(), u.lastError
	w.rejectVia = w.s.RejectHandler
	for len(u.seqs) > 0 {
		es, err := w.heldEntries(ctx, u, 64)
		if err != nil {
			return err
		}
		reason := fmt.Errorf("%w; last error: %s", errDeadLetteredByOperator, u.lastError)
		if ok, err := w.rejectHeld(ctx, u, es, reason); err != nil || !ok {
			return err
		}
		w.attempts = 0
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
// held retries delivered one at a time, as in flight, taking a share of
// the process's gate first.
func (w *Worker) markHeld(ctx context.Context, seq int64) error {
	if err := w.takeShare(ctx); err != nil {
		return gateError(ctx, err)
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	var deliveries int32
	err := pgexec.QueryRow(dctx, w.s.Store.db, w.s.Store.q.HeldCount, w.fenceArgs(seq, false), &deliveries)
	if errors.Is(err, pgx.ErrNoRows) {
		w.iso.loaded = false
		return w.lease.Verify(dctx, "count a held retry", -1)
	}
	return err
}
