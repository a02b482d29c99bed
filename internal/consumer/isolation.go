package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/pgtext"
	"github.com/millrace/watermill-outbox/internal/sentinel"
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
// the same way. The held messages of a key are retried from their own rows
// (held.go), head first, with the usual backoff, MaxAttempts and Reject
// rules; when the head succeeds or is dead-lettered it leaves the table and
// the next one of the key becomes the head, due at once. A key is free
// again when it holds nothing: its newer messages are all above the scan
// position, so none can overtake an older one. Keyless messages are held
// alone and park nothing.

// heldUnit is one held key (or one keyless message): its held seqs in order
// and the state of the head's retries.
type heldUnit struct {
	key          string
	keyless      bool
	seqs         []int64
	entries      map[int64]Entry // read ahead for the retries
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

// isolation is a worker's held-back state, mirrored from the held table.
type isolation struct {
	cfg      Isolation
	loaded   bool
	loadedAt time.Time
	units    []*heldUnit // by head seq
	byKey    map[string]*heldUnit
	messages int
	// parking: rows to write with the next scan move (split, hold).
	parking []Hold
	// full: the bounds stopped a hold or a park (shown on the cursor row).
	full, fullShown bool
	// scanBlockedUntil: the scan's head is backing off (blocking fallback,
	// or the backoff found on the cursor row at acquisition).
	scanBlockedUntil time.Time
	// holdHead: the scan's head failed for reasons of its own without
	// being held (it crashed its consumer alone, or the bounds were
	// reached): hold it on the next read if the bounds allow.
	holdHead       bool
	warnedNoReject bool
}

// heldReloadEvery is how often a worker with held keys re-reads them, for
// the operators' requests (admin.RetryHeldNow, DeadLetterHeld).
const heldReloadEvery = time.Second

// maxErrorText bounds the error text stored on a held row.
const maxErrorText = 2000

func newIsolation(cfg Isolation, charged int) *isolation {
	if !cfg.Enabled {
		return nil
	}
	return &isolation{cfg: cfg, byKey: map[string]*heldUnit{}, holdHead: charged > 0}
}

// blocked records that the scan's head failed without being held: for a
// reason of its own (the bounds stopped the hold) or not (the partition
// blocks on purpose).
func (iso *isolation) blocked(reason error, delay time.Duration) {
	iso.holdHead = holdable(reason)
	iso.scanBlockedUntil = time.Now().Add(delay)
}

// isolatedTurn is a turn with key-level isolation: the held keys' due
// retries first, then the scan (unless its head is backing off).
func (w *Worker) isolatedTurn(ctx context.Context) (worker.Directive, error) {
	if d := w.takeInitialBackoff(); d > 0 {
		w.iso.scanBlockedUntil = time.Now().Add(d)
	}
	if stop, err := w.serveHeld(ctx); stop {
		return w.wake(worker.Idle()), err
	}
	if wait := time.Until(w.iso.scanBlockedUntil); wait > 0 {
		return w.wake(worker.Sleep(wait)), nil
	}
	dir, err := w.scan(ctx)
	return w.wake(dir), err
}

// isolateBatch sorts a batch read after the scan position into the
// messages to deliver, which it returns, and those parked behind their
// held key (split).
// settled reports that it settled the batch itself: nothing to deliver
// (the scan moved past what it parked, or the bounds stop it), or the
// head, which failed before (it crashed its consumer alone, or failed while
// the bounds were reached), held at once.
func (w *Worker) isolateBatch(ctx context.Context, b batch) (batch, turnEnd, bool) {
	first := b.deliver[0]
	deliver, scanEnd, cut := w.iso.split(b.deliver)
	if cut {
		w.setFull(ctx, true)
	}
	if w.iso.holdHead && len(deliver) > 0 && deliver[0].Seq == first.Seq && deliver[0].Seq == w.ledger.seq && w.ledger.charged > 0 {
		if w.exhaustedHead(deliver[0]) {
			return b, turnEnd{dir: w.rejectExhaustedHead(ctx, deliver[0])}, true
		}
		if w.iso.canHold(deliver[0]) {
			last := w.ledger.lastError
			if last == "" {
				last = "failed before"
			}
			w.hold(deliver[0], w.ledger.charged, errors.New(last)) // (the delivery counted by read does not happen)
			deliver, scanEnd = nil, deliver[0].Seq
		}
	}
	b.deliver, b.scanEnd = deliver, scanEnd
	if len(deliver) > 0 {
		return b, turnEnd{}, false
	}
	if scanEnd == 0 { // the bounds stop the scan at its first message
		w.undoDelivery(ctx)
		return b, turnEnd{dir: worker.Idle()}, true
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if _, err := w.withBulkhead(dctx, func() ([]Entry, error) { return nil, w.moveScan(dctx, nil, scanEnd) }); err != nil {
		return b, turnEnd{dir: worker.Idle(), err: err}, true
	}
	w.moved(scanEnd)
	return b, turnEnd{dir: worker.Proceed()}, true
}

// split sorts a batch read after the scan position into the messages to
// deliver and those to park behind their held key (recorded in parking).
// scanEnd is the last seq the scan covers; it stops early (cut) at a
// message it can neither deliver nor park because the bounds are reached.
func (iso *isolation) split(entries []Entry) (deliver []Entry, scanEnd int64, cut bool) {
	iso.parking = iso.parking[:0]
	if len(iso.byKey) == 0 {
		return entries, entries[len(entries)-1].Seq, false // nothing to park behind
	}
	deliver = entries[:0:0]
	for _, e := range entries {
		if e.Key != "" && iso.byKey[e.Key] != nil {
			if iso.messages+len(iso.parking)+1 > iso.cfg.MaxHeldMessages {
				return deliver, scanEnd, true
			}
			iso.parking = append(iso.parking, Hold{Seq: e.Seq, Key: e.Key})
		} else {
			deliver = append(deliver, e)
		}
		scanEnd = e.Seq
	}
	return deliver, scanEnd, false
}

// holdable says whether a failure is the message's own, so that holding
// its key back lets the others go on.
func holdable(reason error) bool { return !errors.Is(reason, sentinel.ErrNotKeySpecific) }

// canHold says whether e can be held as the head of a new held key.
func (iso *isolation) canHold(Entry) bool {
	return len(iso.units)+1 <= iso.cfg.MaxHeldKeys && iso.messages+len(iso.parking)+1 <= iso.cfg.MaxHeldMessages
}

// holdFailure, with key-level isolation, works out how far the scan moves
// after the handler finished h.done of the batch (done without isolation)
// and holds the message that failed, if it can (held).
func (w *Worker) holdFailure(ctx context.Context, b batch, h handled) (int64, bool) {
	done := w.scanDone(b, h.done)
	if h.outcome != nacked || !holdable(h.reason) {
		return done, false
	}
	if e := b.deliver[h.done]; w.iso.canHold(e) {
		w.hold(e, w.attemptsOf(e.Seq), h.reason)
		return e.Seq, true
	}
	w.setFull(ctx, true)
	return done, false
}

// scanDone is how far the scan gets with key-level isolation when the
// handler finished processed of the batch: to its scanEnd when it finished
// them all, else to just before the one that failed.
func (w *Worker) scanDone(b batch, processed int) int64 {
	if processed >= len(b.deliver) {
		return b.scanEnd
	}
	return max(w.cursor, b.deliver[processed].Seq-1)
}

// hold adds e, which failed its attempts-th delivery with reason, to the
// rows written with the next scan move, as the head of a new held key.
func (w *Worker) hold(e Entry, attempts int, reason error) {
	if reason == nil {
		reason = errors.New("nacked")
	}
	delay := w.heldBackoff(attempts)
	text := pgtext.Clean(fmt.Sprintf("seq %d, attempt %d: %v", e.Seq, attempts, reason), maxErrorText)
	w.iso.parking = append(w.iso.parking, Hold{Seq: e.Seq, Key: e.Key, Keyless: e.Key == "", Attempts: attempts, Err: text, Delay: delay})
	w.logger.Error("Message failed: held back with its key while the partition goes on", reason, watermill.LogFields{
		"seq": e.Seq, "key": e.Key, "attempt": attempts, "retry_in": delay})
}

// heldBackoff is the delay before the retry that follows a held head's
// attempts-th failure: the shared backoff with the Tuning's bounds.
func (w *Worker) heldBackoff(attempts int) time.Duration {
	return backoff.Policy{Base: w.s.Tuning.BackoffBase, Max: w.s.Tuning.BackoffMax}.Delay(max(attempts, 1))
}

// committed applies the parking rows written by a committed scan move.
func (iso *isolation) committed() {
	if iso == nil {
		return
	}
	for _, r := range iso.parking {
		iso.messages++
		if u := iso.byKey[r.Key]; !r.Keyless && u != nil {
			u.seqs = append(u.seqs, r.Seq)
			continue
		}
		u := &heldUnit{key: r.Key, keyless: r.Keyless, seqs: []int64{r.Seq}, attempts: r.Attempts, deliveries: r.Attempts,
			lastError: r.Err, firstFailure: time.Now(), retryAt: time.Now().Add(r.Delay)}
		iso.units = append(iso.units, u)
		if !r.Keyless {
			iso.byKey[r.Key] = u
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
			"hint": "fix or dead-letter the held keys (admin.DeadLetterHeld), or raise KeyIsolation.MaxHeldKeys"})
	}
	iso.full = full
	if iso.fullShown == full {
		return
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if err := w.s.Store.HeldShowFull(dctx, w.topic, w.lease, full); err != nil {
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
