package delivery

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/warnlog"
	"github.com/millrace/watermill-outbox/internal/worker"
)

// Config is what the partition workers of one subscription share: the
// Subscriber's settings and the machinery it owns.
type Config struct {
	Group             string
	Transactional     bool // the Transactional strategy: handlers run in the cursor's transaction
	MaxAttempts       int
	HandlerTimeout    time.Duration
	CloseTimeout      time.Duration
	SyncCursorCommits bool
	Tuning            adaptive.Tuning
	RejectHandler     RejectHandler // nil: rejected messages are retried
	Isolation         Isolation     // key-level isolation (off when not Enabled)

	Store  *Store  // the log, transactions, adaptive state
	Marker *Marker // records deliveries in flight after a batch's head (careful mode)
	// Careful is the Subscriber's careful mode (see Careful): set up by
	// NewSubscriber; nil: never careful.
	Careful  *Careful
	Bulkhead *worker.Bulkhead
	Logger   watermill.LoggerAdapter

	// Register makes p, a worker's poker, reachable by the notifications
	// for its partition; the function it returns undoes that.
	Register func(topic string, partition int, p *worker.Poker) (unregister func())
	// Stop ends when the Subscriber closes. Background counts the
	// goroutines of abandoned handlers, which the Subscriber's Close waits
	// for.
	Stop       context.Context
	Background *sync.WaitGroup
	// Counts are the Subscriber's running totals (Subscriber.Stats).
	Counts *Counts
}

// Counts are running totals of a Subscriber's deliveries.
type Counts struct {
	Acked, Nacked, Rejected, TimedOut, Crashed, Batches atomic.Int64
}

// BatchHandler is the handler of ConsumeBatches (outbox.BatchHandler).
type BatchHandler = func(ctx context.Context, batch []*message.Message) (done int, err error)

// Worker delivers one partition of one topic to one subscription while its
// lease lasts: read a batch after the cursor, hand it out, wait for the
// answers, move the cursor (and reject, retry or back off), again.
type Worker struct {
	s      *Config
	topic  string
	part   int
	lease  Lease
	out    chan<- *message.Message
	mode   Policy
	poker  *worker.Poker
	logger watermill.LoggerAdapter

	cursor int64 // last seq done, as stored in the cursor row

	batch     BatchHandler // set for ConsumeBatches, nil for Subscribe
	handleErr error        // a database error met while handling a batch

	// The message last handed to the subscription, whose metadata (as the
	// handler and middleware left it) goes with a rejection.
	lastMsg *message.Message

	// The adaptive state last written to the cursor row.
	shownState adaptive.State
	shownSize  int

	// Failures of the message at the head of the partition (cursor+1), or
	// of the message delivered last when it is further on.
	headSeq      int64
	attempts     int // deliveries of headSeq, counted before hand-out
	charged      int // failed attempts of headSeq recorded (cursors.attempts)
	firstFailure time.Time
	lastFailure  time.Time
	lastError    string // last failure recorded for the head, for dead letters

	// initialBackoff is what was left of the backoff recorded on the
	// cursor row when the lease was acquired.
	initialBackoff time.Duration
	// handedOut is set once the batch's first message reached the handler.
	handedOut bool
	// suspectFrom..suspectTo are messages that were in flight when a
	// process died with other deliveries in flight: each is delivered
	// alone (holding the process's gate alone), so that a crash is evidence
	// against it. 0, 0: none.
	suspectFrom, suspectTo int64
	// gateHold is the delivery's hold on the process's gate (nil: none).
	gateHold *gateHold
	// timer bounds the wait for a handler's answer (reused per message).
	timer *time.Timer
	// spanName and spanAttrs are shared by the trace spans of this worker's
	// deliveries.
	spanName  string
	spanAttrs []attribute.KeyValue
	// incarnation is the topic's MetadataIncarnation ("" when unknown).
	incarnation string
	// rejectVia is the RejectHandler of the rejection in progress (the
	// delivery's, from RejectTo, or the Subscriber's).
	rejectVia RejectHandler
	// iso is the held-back state of key-level isolation (nil: off).
	iso *isolation
}

type logEntry struct {
	seq      int64
	uuid     string
	key      string
	metadata map[string]string
	payload  []byte
	// payloadMissing: the payload was kept in bodies, and its row is gone;
	// the message cannot be delivered as it was written (see
	// errs.ErrPayloadMissing).
	payloadMissing bool
}

type outcome int

const (
	acked outcome = iota
	nacked
	rejected
	stopped  // the lease or the subscription ended before an answer
	timedOut // no answer within HandlerTimeout (Transactional: the transaction must be given up)
	broken   // the handler left the transaction unusable (Transactional)
	isolate  // a batch handler of several messages timed out: retry them one at a time
)

// NewWorker creates the worker of the partition l leases, delivering to out
// one message at a time, or to batch when it is not nil (ConsumeBatches).
func NewWorker(s *Config, topic, incarnation string, l Lease, out chan<- *message.Message, batch BatchHandler) *Worker {
	mode, _ := adaptive.NewMode(s.Tuning.ModeConfig()) // validated with the config
	for range min(l.Attempts(), 32) {
		mode.Failed(0) // keep the backoff level across restarts and moves
	}
	w := &Worker{
		s:      s,
		batch:  batch,
		topic:  topic,
		part:   l.Partition(),
		lease:  l,
		out:    out,
		mode:   mode,
		poker:  worker.NewPoker(),
		cursor: l.Cursor(),
		// Deliveries of the head message before this lease (other
		// instances, earlier leases) count towards its attempts.
		headSeq:        l.Cursor() + 1,
		attempts:       l.Attempts(),
		charged:        l.Attempts(),
		lastError:      l.LastError(),
		initialBackoff: l.Backoff(),
		logger:         s.Logger.With(watermill.LogFields{"topic": topic, "partition": l.Partition()}),
		incarnation:    incarnation,
		iso:            newIsolation(s.Isolation, l.Charged()),
		spanName:       topic + " process",
		spanAttrs:      observe.ProcessAttributes(s.Group, topic, l.Partition()),
	}
	w.suspectFrom, w.suspectTo = l.Suspects()
	if l.Charged() > 0 || l.UnexplainedCrash() || w.suspectTo > 0 {
		s.Careful.Extend() // a consumer process of the group died: be careful for a while
	}
	if n := l.Charged(); n > 0 {
		observe.Current().Crashed(s.Group, topic, n)
		if s.Counts != nil {
			s.Counts.Crashed.Add(int64(n))
		}
		w.logger.Error("A delivery ended without an outcome while it was the only one in flight in its process: counted as a failed attempt", nil, watermill.LogFields{
			"seq": w.headSeq, "charged": n, "attempts": l.Attempts(), "max_attempts": s.MaxAttempts,
			"hint": "the consumer process died, was killed or lost its lease while handling this message alone"})
	}
	if l.UnexplainedCrash() {
		w.logger.Error("Deliveries ended without an outcome while others were in flight in the same process: nobody is charged; delivering them alone to find the one that crashes it", nil, watermill.LogFields{
			"suspects_from": w.suspectFrom, "suspects_to": w.suspectTo,
			"hint": "the consumer process died, was killed or lost its lease"})
	}
	return w
}

// Run delivers until the lease ends.
func (w *Worker) Run() {
	defer w.s.Register(w.topic, w.part, w.poker)()
	cfg := worker.Config{
		Name:    StableID(w.topic, w.part, 0),
		Pacing:  w.s.Tuning.Pacing,
		Backoff: worker.BackoffConfig{Base: w.s.Tuning.BackoffBase, Max: w.s.Tuning.BackoffMax},
		Poker:   w.poker,
		OnFailure: func(f worker.Failure) {
			if !leaseEnded(f.Err) {
				w.logger.Error("Partition worker failed, backing off", f.Err, watermill.LogFields{"seq": w.cursor + 1, "retry_in": f.RetryIn})
			}
		},
	}
	action := worker.ActionFunc(w.executeLeased)
	if w.s.Transactional {
		// The transaction holds a connection while the handler runs, so the
		// bulkhead covers the whole batch.
		cfg.Bulkhead = w.s.Bulkhead
		action = w.executeTransactional
	}
	_ = worker.Run(w.lease.Context(), cfg, action)
	w.Stop()
}

// Step runs one turn of the worker in the caller's goroutine, the turn Run
// repeats (for a caller that drives delivery itself: outboxtest's
// synchronous runner). Proceed: more is waiting; Idle: nothing to do (or a
// held key's retry is due later); Sleep: backing off. An error is what Run
// would back off from; lease.ErrLeaseLost when the lease ended.
func (w *Worker) Step(ctx context.Context) (worker.Directive, error) {
	if w.s.Transactional {
		return w.executeTransactional(ctx)
	}
	return w.executeLeased(ctx)
}

// Stop is what Run does when it ends, for a caller of Step: it gives back
// the worker's hold on the process's delivery gate, if any, and takes back
// a delivery still recorded as in flight. The worker stops because its
// lease ends: released (Close, rebalance, pause) the lease still holds, and
// a delivery it interrupted is not a crash, so the next holder finds
// nothing to settle; lost, the fenced write changes nothing, and the next
// holder settles it (migrations/0009_crash_evidence.sql).
func (w *Worker) Stop() {
	w.releaseGate()
	w.undoDelivery(w.lease.Context())
}

// errNotReached ends the trace span of a batch's message after the one
// that failed: it was not handled, and comes again.
var errNotReached = errors.New("outbox: not handled: a message before it in the batch failed")

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
		if errors.As(err, new(*exhaustedError)) {
			o = observe.Reject // dead-lettered once the transaction is given up
		}
	case nacked, broken:
		o = observe.Nack
		if errors.Is(err, errs.ErrHandlerTimeout) {
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

// errStopped ends the trace span of a delivery that got no answer before
// its lease or subscription ended.
var errStopped = errors.New("outbox: delivery stopped before an answer: it is delivered again")

// leaseEnded reports an error that only says the lease is gone: the worker
// stops, and the next holder goes on from the cursor.
func leaseEnded(err error) bool { return errors.Is(err, lease.ErrLeaseLost) }

// dbContext outlives the lease context by a little, so that work finished
// while a lease is being released (Close, rebalancing) is still recorded.
func dbContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}

// executeLeased runs one batch outside any transaction.
func (w *Worker) executeLeased(ctx context.Context) (worker.Directive, error) {
	if w.iso != nil {
		return w.isolatedTurn(ctx, w.scanLeased)
	}
	if d := w.takeInitialBackoff(); d > 0 {
		return worker.Sleep(d), nil
	}
	return w.scanLeased(ctx)
}

// isolatedTurn is a turn with key-level isolation: the held keys' due
// retries first, then the scan (unless its head is backing off).
func (w *Worker) isolatedTurn(ctx context.Context, scan worker.ActionFunc) (worker.Directive, error) {
	if d := w.takeInitialBackoff(); d > 0 {
		w.iso.scanBlockedUntil = time.Now().Add(d)
	}
	if stop, err := w.serveHeld(ctx); stop {
		return w.wake(worker.Idle()), err
	}
	if wait := time.Until(w.iso.scanBlockedUntil); wait > 0 {
		return w.wake(worker.Sleep(wait)), nil
	}
	dir, err := scan(ctx)
	return w.wake(dir), err
}

// isolateBatch, with key-level isolation, sorts a batch read after the scan
// position into the messages to deliver and those parked behind their held
// key (split). handled reports that it settled the batch itself: nothing
// to deliver (the scan moved past what it parked, or the bounds stop it),
// or the head, which failed before (it crashed its consumer, or failed
// while the bounds were reached), held at once.
func (w *Worker) isolateBatch(ctx context.Context, entries []logEntry) (deliver []logEntry, scanEnd int64, dir worker.Directive, handled bool, err error) {
	deliver, scanEnd, cut := w.iso.split(entries)
	if cut {
		w.setFull(ctx, true)
	}
	if w.iso.holdHead && len(deliver) > 0 && deliver[0].seq == entries[0].seq && deliver[0].seq == w.headSeq && w.charged > 0 {
		if dir, ok := w.rejectExhaustedHead(ctx, deliver[0]); ok {
			return nil, 0, dir, true, nil
		}
		if w.iso.canHold(deliver[0]) {
			last := w.lastError
			if last == "" {
				last = "failed before"
			}
			w.hold(deliver[0], w.charged, errors.New(last)) // (the delivery counted by read does not happen)
			deliver, scanEnd = nil, deliver[0].seq
		}
	}
	if len(deliver) > 0 {
		return deliver, scanEnd, worker.Directive{}, false, nil
	}
	if scanEnd == 0 { // the bounds stop the scan at its first message
		w.undoDelivery(ctx)
		return nil, 0, worker.Idle(), true, nil
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	_, err = w.withBulkhead(dctx, func() ([]logEntry, error) {
		return nil, w.moveScan(dctx, nil, scanEnd)
	})
	if err != nil {
		return nil, 0, worker.Idle(), true, err
	}
	w.cursor = scanEnd
	return nil, 0, worker.Proceed(), true, nil
}

// triage prepares a batch read after the cursor: with key-level isolation
// it sorts out what to deliver (isolateBatch), and it takes a head that
// has had its MaxAttempts out. handled reports that the batch is settled.
func (w *Worker) triage(ctx context.Context, entries []logEntry) (deliver []logEntry, scanEnd int64, dir worker.Directive, handled bool, err error) {
	deliver = entries
	if w.iso != nil {
		if deliver, scanEnd, dir, handled, err = w.isolateBatch(ctx, entries); handled {
			return nil, 0, dir, true, err
		}
	}
	if deliver[0].seq == entries[0].seq {
		if dir, ok := w.rejectExhaustedHead(ctx, deliver[0]); ok {
			return nil, 0, dir, true, nil
		}
	}
	return deliver, scanEnd, worker.Directive{}, false, nil
}

// holdFailure, with key-level isolation, works out how far the scan moves
// after the handler finished processed of deliver (done without isolation)
// and holds the message that failed, if it can (held).
func (w *Worker) holdFailure(ctx context.Context, deliver []logEntry, processed int, result outcome, reason error, scanEnd, done int64) (int64, bool) {
	if w.iso == nil {
		return done, false
	}
	done = w.scanDone(deliver, processed, scanEnd)
	if result != nacked || !holdable(reason) {
		return done, false
	}
	if e := deliver[processed]; w.iso.canHold(e) {
		w.hold(e, w.attemptsOf(e.seq), reason)
		return e.seq, true
	}
	w.setFull(ctx, true)
	return done, false
}

// scanDone is how far the scan gets with key-level isolation when the
// handler finished processed of deliver: to scanEnd when it finished them
// all, else to just before the one that failed.
func (w *Worker) scanDone(deliver []logEntry, processed int, scanEnd int64) int64 {
	if processed >= len(deliver) {
		return scanEnd
	}
	return max(w.cursor, deliver[processed].seq-1)
}

// attemptsOf is the attempt number of the last delivery of the message at
// seq (1 unless it is the head the worker counts failures of).
func (w *Worker) attemptsOf(seq int64) int {
	if seq == w.headSeq {
		return max(w.attempts, 1)
	}
	return 1
}

// scanLeased reads and delivers one batch after the cursor, outside any
// transaction.
func (w *Worker) scanLeased(ctx context.Context) (worker.Directive, error) {
	defer w.releaseGate()
	size := w.mode.BatchSize()
	// The gate before the bulkhead: a worker waiting for the gate must not
	// hold a slot that a delivery in flight needs to record its outcome.
	if err := w.takeGate(ctx); err != nil {
		return worker.Idle(), gateError(ctx, err)
	}
	entries, err := w.withBulkhead(ctx, func() ([]logEntry, error) { return w.read(ctx, size) })
	if err != nil || len(entries) == 0 {
		return worker.Idle(), err
	}
	full := len(entries) == size || w.suspectTo > 0
	deliver, scanEnd, dir, handled, err := w.triage(ctx, entries)
	if handled {
		return dir, err
	}
	processed, result, reason := w.handleOrFail(ctx, deliver, nil)
	if result == isolate {
		w.undoDelivery(ctx) // not the head's failure
		w.mode.Rejected(0)
		w.showState(ctx)
		return worker.Proceed(), nil
	}
	done := w.cursor
	if processed > 0 {
		done = deliver[processed-1].seq
	}
	done, held := w.holdFailure(ctx, deliver, processed, result, reason, scanEnd, done)
	if result == rejected {
		if err := w.rejectInOwnTx(ctx, deliver[processed], reason); err != nil {
			result, reason = nacked, err
		} else {
			done = deliver[processed].seq
		}
	}
	if done > w.cursor {
		dctx, cancel := dbContext(ctx)
		defer cancel()
		advance := func() ([]logEntry, error) { return nil, w.moveScan(dctx, nil, done) }
		if _, err := w.withBulkhead(dctx, advance); err != nil {
			return worker.Idle(), err
		}
		w.cursor = done
	}
	if err := w.takeHandleError(); err != nil {
		return worker.Idle(), err // (recording a delivery in flight failed: the rest comes again)
	}
	if held {
		w.showState(ctx)
		return worker.Proceed(), nil
	}
	var delay time.Duration
	if result == nacked {
		delay = w.noteFailure(processed)
		if w.iso != nil {
			w.iso.blocked(reason, delay)
		}
	}
	return w.settle(ctx, result, reason, processed, full, w.s.Store.DB(), delay)
}

// takeInitialBackoff returns, once, what was left of the backoff recorded
// on the cursor row when the lease was acquired: a restart or a lease move
// does not retry a failing message early.
func (w *Worker) takeInitialBackoff() time.Duration {
	d := w.initialBackoff
	w.initialBackoff = 0
	return d
}

// rejectExhaustedHead takes the head message out without delivering it
// when MaxAttempts of its deliveries have failed — a delivery that was the
// only one in flight in a process that died included (see
// migrations/0009_crash_evidence.sql). ok reports that it handled the
// batch.
func (w *Worker) rejectExhaustedHead(ctx context.Context, head logEntry) (worker.Directive, bool) {
	maxAttempts := w.s.MaxAttempts
	if maxAttempts <= 0 || w.s.RejectHandler == nil || head.seq != w.headSeq || w.charged < maxAttempts {
		return worker.Directive{}, false
	}
	last := w.lastError
	if last == "" {
		last = "no error recorded"
	}
	// This delivery, counted by read, does not happen.
	w.attempts--
	reason := fmt.Errorf("%w: delivered %d times without success (MaxAttempts %d), a crash of its consumer process while it was the only delivery in flight included; last error: %s",
		errs.ErrPoison, w.attempts, maxAttempts, last)
	w.rejectVia = w.s.RejectHandler
	if err := w.rejectInOwnTx(ctx, head, reason); err != nil {
		if leaseEnded(err) {
			return worker.Idle(), true
		}
		delay := w.noteFailure(0)
		w.recordRetry(ctx, nil, err, delay)
		w.showState(ctx)
		return worker.Sleep(delay), true
	}
	w.logger.Error("Message taken out of the stream after MaxAttempts", reason, watermill.LogFields{"seq": head.seq})
	w.countRejected()
	w.mode.Rejected(0)
	w.showState(ctx)
	return worker.Proceed(), true
}

// executeTransactional runs one batch in one transaction; the cursor moves
// in the same transaction, so the handlers' writes commit with it.
func (w *Worker) executeTransactional(ctx context.Context) (_ worker.Directive, err error) {
	if w.iso != nil {
		return w.isolatedTurn(ctx, w.scanTransactional)
	}
	if d := w.takeInitialBackoff(); d > 0 {
		return worker.Sleep(d), nil
	}
	return w.scanTransactional(ctx)
}

// scanTransactional reads one batch after the cursor and delivers it in
// one transaction.
func (w *Worker) scanTransactional(ctx context.Context) (_ worker.Directive, err error) {
	defer w.releaseGate()
	size := w.mode.BatchSize()
	if err := w.takeGate(ctx); err != nil {
		return worker.Idle(), gateError(ctx, err)
	}
	// Read (and count the head's delivery) outside the transaction, so
	// that the count survives a crash that rolls the transaction back.
	entries, err := w.read(ctx, size)
	if err != nil || len(entries) == 0 {
		return worker.Idle(), err
	}
	full := len(entries) == size || w.suspectTo > 0
	deliver, scanEnd, dir, handled, err := w.triage(ctx, entries)
	if handled {
		return dir, err
	}
	tx, err := w.s.Store.Begin(ctx)
	if err != nil {
		w.undoDelivery(ctx)
		return worker.Idle(), err
	}
	guard := newTxGuard(tx)
	finished := false
	defer func() {
		if !finished {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	dctx, cancel := dbContext(ctx)
	defer cancel()
	processed, result, reason := w.handleOrFail(ctx, deliver, guard)
	if err := w.takeHandleError(); err != nil {
		// A database failure (the connection was lost, say) is not the
		// message's: its delivery does not count.
		w.undoDelivery(ctx)
		return worker.Idle(), err
	}
	switch result {
	case timedOut, broken, stopped, isolate:
		if result == stopped && !w.handedOut {
			break // nothing reached a handler: commit the prefix, if any
		}
		// A handler may still be using the transaction (timed out, or no
		// answer before the lease ended), or left it unusable: give the
		// whole transaction up. The done prefix is delivered again.
		finished = true
		if result == broken {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		} else {
			guard.abandon(w.s.Background, w.s.Stop, w.s.CloseTimeout, func(err error) {
				w.logger.Error("Cannot roll back the transaction of a timed-out handler", err, watermill.LogFields{"seq": w.cursor + 1})
			})
		}
		return w.failWholeTx(ctx, deliver, processed, result, reason)
	}
	done := w.cursor
	if processed > 0 {
		done = deliver[processed-1].seq
	}
	done, held := w.holdFailure(ctx, deliver, processed, result, reason, scanEnd, done)
	if result == rejected {
		if err := w.rejectVia.HandleReject(dctx, tx, w.rejectedMessage(deliver[processed], reason)); err != nil {
			return worker.Idle(), fmt.Errorf("outbox: reject handler: %w", err)
		}
		done = deliver[processed].seq
	}
	q, _ := pgexec.FromTx(tx)
	defer w.iso.abandoned() // (after a commit, committed took them)
	if done > w.cursor {
		if err = w.moveScan(dctx, q, done); err != nil {
			return worker.Idle(), err
		}
	}
	var delay time.Duration
	if result == nacked && !held {
		delay = w.noteFailure(processed)
		if err := w.lease.RecordRetry(dctx, q, w.failure(reason), delay); err != nil {
			return worker.Idle(), err
		}
	}
	finished = true
	if err := tx.Commit(dctx); err != nil {
		return worker.Idle(), err
	}
	if result == nacked && !held {
		w.charged++
	}
	w.iso.committed()
	w.cursor = done
	if held {
		w.showState(ctx)
		return worker.Proceed(), nil
	}
	if result == nacked && w.iso != nil {
		w.iso.blocked(reason, delay)
	}
	return w.settle(ctx, result, reason, processed, full, nil, delay)
}

// failWholeTx settles a Transactional batch whose transaction was given up
// because of the message at index at: a timed-out handler, one that broke
// the transaction, or one that never answered before the lease ended. The
// head's failure is a counted attempt (and, after MaxAttempts, a dead
// letter); a later message's is retried in a smaller batch, where it
// becomes the head.
func (w *Worker) failWholeTx(ctx context.Context, entries []logEntry, at int, result outcome, reason error) (worker.Directive, error) {
	switch result {
	case stopped:
		// The lease is ending; the delivery stays counted (deliveries) and
		// the next holder charges it as an attempt without an outcome.
		return worker.Idle(), nil
	case isolate:
		w.undoDelivery(ctx) // not the head's failure
		w.mode.Rejected(at) // (a batch handler that timed out: at is 0)
		w.showState(ctx)
		return worker.Proceed(), nil
	}
	w.logger.Error("Transaction given up", reason, watermill.LogFields{"seq": entries[at].seq, "attempt": w.attempts})
	if at > 0 {
		// The head was done: take its delivery back, and commit the done
		// prefix alone next, so that the failing message becomes the head
		// and is charged for its failures.
		w.undoDelivery(ctx)
		w.mode.Rejected(at)
		w.showState(ctx)
		return worker.Proceed(), nil
	}
	got, why := w.answer(&delivery{}, nacked, entries[0], reason)
	if got == rejected {
		if err := w.rejectInOwnTx(ctx, entries[0], why); err == nil {
			w.mode.Rejected(0)
			w.showState(ctx)
			return worker.Proceed(), nil
		} else if leaseEnded(err) {
			return worker.Idle(), nil
		} else {
			reason = err
		}
	}
	if w.iso != nil && holdable(why) {
		if w.iso.canHold(entries[0]) {
			return w.holdInOwnTx(ctx, entries[0], why)
		}
		w.setFull(ctx, true)
	}
	delay := w.noteFailure(0)
	w.recordRetry(ctx, nil, w.failure(reason), delay)
	w.showState(ctx)
	if w.iso != nil {
		w.iso.blocked(why, delay)
	}
	return worker.Sleep(delay), nil
}

// holdInOwnTx holds e, whose transaction was given up, and moves the scan
// past it (and what was parked before it) in a transaction of its own.
func (w *Worker) holdInOwnTx(ctx context.Context, e logEntry, reason error) (worker.Directive, error) {
	w.hold(e, w.attemptsOf(e.seq), reason)
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if err := w.moveScan(dctx, nil, e.seq); err != nil {
		if leaseEnded(err) {
			return worker.Idle(), nil
		}
		return worker.Idle(), err
	}
	w.cursor = e.seq
	w.showState(ctx)
	return worker.Proceed(), nil
}

// handle gives the batch to the subscription: one message at a time over
// the channel, or all at once to a BatchHandler. It returns how many
// entries from the start are done and how the next one (if any) ended:
// nacked, rejected, stopped, or (with tx) timedOut or broken. With tx set
// (Transactional) it keeps the done prefix's writes and undoes the rest
// with savepoints, and checks after every ack that the handler left the
// transaction usable.
func (w *Worker) handle(ctx context.Context, entries []logEntry, tx *txGuard) (int, outcome, error) {
	return w.handleMarking(ctx, entries, tx, w.markInFlight)
}

// markInFlight records the message at seq, after the head of a batch
// delivered one at a time, as the partition's delivery in flight, taking a
// share of the process's gate first.
func (w *Worker) markInFlight(ctx context.Context, seq int64) error {
	if err := w.takeShare(ctx); err != nil {
		return gateError(ctx, err)
	}
	if !w.marksEach() {
		return nil // (the read recorded the whole batch in flight)
	}
	ok, err := w.s.Marker.mark(ctx, w.s.Stop, w.s.Background, w.topic, w.lease, seq)
	if err != nil || ok {
		return err
	}
	return w.lease.Verify(ctx, "record a delivery in flight", -1)
}

// handleMarking is handle with mark, which records each message after the
// first as in flight before it is handed out (the first one's delivery was
// recorded with the read).
func (w *Worker) handleMarking(ctx context.Context, entries []logEntry, tx *txGuard, mark func(context.Context, int64) error) (int, outcome, error) {
	w.handedOut = false
	if w.batch != nil {
		return w.handleBatch(ctx, entries, tx)
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	for i, e := range entries {
		if i > 0 {
			w.answered()
			if err := mark(ctx, e.seq); err != nil {
				if !leaseEnded(err) && ctx.Err() == nil {
					w.handleErr = err
				}
				return i, stopped, nil
			}
		}
		if tx != nil {
			// Release the previous message's savepoint (which fails if its
			// handler aborted the transaction) and set this one's, in one
			// round trip (simple protocol).
			stmt := w.s.Store.Savepoints().TxSavepointDelivery
			if i > 0 {
				stmt = w.s.Store.Savepoints().TxNextDelivery
			}
			if _, err := tx.tx.Exec(dctx, stmt); err != nil {
				if i > 0 && !connLost(tx) {
					return w.brokenTx(dctx, tx, entries, i-1, err)
				}
				w.handleErr = err
				return i, stopped, nil
			}
		}
		result, reason := w.deliver(ctx, e, tx)
		if result == stopped && i == 0 && !w.handedOut {
			w.undoDelivery(ctx)
		}
		if result != stopped && result != timedOut {
			w.answered()
		}
		if result == acked && tx != nil {
			if what := tx.takeMisuse(); what != "" {
				result, reason = w.answer(&delivery{}, nacked, e, &errs.TxMisuseError{Seq: e.seq, What: what})
			}
		}
		if result == acked {
			continue
		}
		if tx != nil && (result == nacked || result == rejected) {
			// Undo whatever the handler wrote for this message.
			if _, err := tx.tx.Exec(dctx, w.s.Store.Savepoints().TxRollbackDelivery); err != nil {
				if connLost(tx) {
					w.handleErr = err
					return i, stopped, nil
				}
				return i, broken, &errs.TxMisuseError{Seq: e.seq, What: misuseEnded, Cause: err}
			}
		}
		return i, result, reason
	}
	if tx != nil {
		if _, err := tx.tx.Exec(dctx, w.s.Store.Savepoints().TxReleaseDelivery); err != nil {
			if connLost(tx) {
				w.handleErr = err
				return len(entries) - 1, stopped, nil
			}
			return w.brokenTx(dctx, tx, entries, len(entries)-1, err)
		}
	}
	return len(entries), acked, nil
}

// connLost reports whether the transaction's connection is gone (a server
// restart, a network failure): a failed statement is then no fault of the
// handler's, and the batch fails as a database error, not a counted attempt.
func connLost(tx *txGuard) bool {
	return tx.tx.Conn().IsClosed()
}

// brokenTx handles a savepoint statement that failed after the handler of
// entries[at] acked: the handler aborted or ended the transaction. It rolls
// back to that message's savepoint and fails it (a counted attempt), or,
// when even that fails, reports the transaction broken.
func (w *Worker) brokenTx(ctx context.Context, tx *txGuard, entries []logEntry, at int, cause error) (int, outcome, error) {
	e := entries[at]
	if _, err := tx.tx.Exec(ctx, w.s.Store.Savepoints().TxRollbackDelivery); err != nil {
		if connLost(tx) {
			w.handleErr = err
			return at, stopped, nil
		}
		return at, broken, &errs.TxMisuseError{Seq: e.seq, What: misuseEnded, Cause: cause}
	}
	result, reason := w.answer(&delivery{}, nacked, e, &errs.TxMisuseError{Seq: e.seq, What: misuseAborted, Cause: cause})
	return at, result, reason
}

// undoDelivery takes back the delivery the read counted for the head when
// it never reached a handler.
func (w *Worker) undoDelivery(ctx context.Context) {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if err := w.lease.UndoDelivery(dctx, w.cursor); err != nil {
		w.logger.Debug("Cannot take back a delivery count", watermill.LogFields{"seq": w.cursor + 1, "err": err})
		return
	}
	if w.headSeq == w.cursor+1 && w.attempts > 0 {
		w.attempts--
	}
}

// takeHandleError returns (and clears) a database error met by handle.
func (w *Worker) takeHandleError() error {
	err := w.handleErr
	w.handleErr = nil
	return err
}

// noteFailure feeds a failed batch (processed messages done before the
// failure) to the adaptive mode and returns how long to wait before the
// retry: the mode's exponential backoff with jitter, so that partitions
// failing together do not retry in lockstep.
func (w *Worker) noteFailure(processed int) time.Duration {
	w.mode.Failed(processed)
	return jitter(w.mode.Backoff())
}

// jitter spreads d over [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d-d/2+1)
}

// recordRetry records a failed attempt at the head and when its retry is
// due, on q (nil: the pool); best effort, logged.
func (w *Worker) recordRetry(ctx context.Context, q pgexec.Querier, cause error, delay time.Duration) {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	err := w.lease.RecordRetry(dctx, q, cause, delay)
	switch {
	case err == nil:
		w.charged++
	case !leaseEnded(err):
		w.logger.Error("Cannot record failure", err, watermill.LogFields{"seq": w.headSeq, "attempt": w.attempts})
	}
}

// settle picks the next step after a batch and shows the adaptive state.
// For a nack (already fed to the mode by noteFailure, which gave delay),
// failureQ, when set, records the failure on the cursor row.
func (w *Worker) settle(ctx context.Context, result outcome, reason error, processed int, full bool, failureQ pgexec.Querier, delay time.Duration) (worker.Directive, error) {
	defer w.showState(ctx)
	switch result {
	case acked:
		w.mode.Succeeded()
		if full {
			return worker.Proceed(), nil
		}
		return worker.Idle(), nil
	case rejected:
		w.mode.Rejected(processed)
		return worker.Proceed(), nil
	case nacked:
		if failureQ != nil {
			w.recordRetry(ctx, failureQ, w.failure(reason), delay)
		}
		return worker.Sleep(delay), nil
	}
	return worker.Idle(), nil // stopped: the loop ends with the lease
}

func (w *Worker) failure(reason error) error {
	if reason == nil {
		reason = errors.New("nacked")
	}
	err := fmtErr(fmt.Errorf("seq %d, attempt %d: %w", w.headSeq, w.attempts, reason))
	w.lastError = err.Error()
	return err
}

// withBulkhead runs fn in a slot of the bulkhead that bounds the
// partitions querying at once. The Transactional strategy holds one for its
// whole turn (worker.Config.Bulkhead), so fn runs in that one: a second
// would wait for ever once every slot is held by a turn asking for one.
func (w *Worker) withBulkhead(ctx context.Context, fn func() ([]logEntry, error)) ([]logEntry, error) {
	if w.s.Transactional {
		return fn()
	}
	release, err := w.s.Bulkhead.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return fn()
}

// read reads the next batch after the cursor and, in the same statement,
// records on the cursor row, fenced by the lease, a delivery of the head
// message (cursor+1) and what is in flight (the head, or the whole batch
// for a batch handler, and whether it holds the process's gate alone),
// before anything is handed out: a delivery that ends without an outcome
// (a crash) is then settled by the next holder of the lease. The caller
// holds the gate (takeGate). A suspect head is read alone; a batch stops
// before the first suspect.
func (w *Worker) read(ctx context.Context, limit int) ([]logEntry, error) {
	head := w.cursor + 1
	if w.suspectTo > 0 && w.suspectTo < head {
		w.suspectFrom, w.suspectTo = 0, 0
	}
	switch {
	case w.isSuspect(head):
		limit = 1
	case w.suspectTo > 0 && w.suspectFrom > head:
		limit = int(min(int64(limit), w.suspectFrom-head))
	}
	// In flight: the whole batch, but for a batch delivered one message at
	// a time in careful mode, where each message is recorded on its own.
	entries, marked, err := w.s.Store.Read(ctx, w.topic, w.part, w.cursor, limit, w.lease, !w.marksEach(), w.alone())
	if err != nil {
		return nil, err
	}
	if len(entries) > 0 {
		observe.Current().Batch(w.s.Group, w.topic, len(entries))
		if w.s.Counts != nil {
			w.s.Counts.Batches.Add(1)
		}
	}
	if len(entries) == 0 || entries[0].seq != head {
		return entries, nil // (a cursor behind the retained log has no head to count)
	}
	if marked == nil {
		// The fenced count changed nothing: the lease is gone, or the
		// cursor was moved under it.
		return nil, w.lease.Verify(ctx, "count a delivery", w.cursor)
	}
	if w.headSeq != entries[0].seq {
		w.headSeq, w.charged = entries[0].seq, 0
		w.firstFailure, w.lastFailure = time.Time{}, time.Time{}
	}
	w.attempts = int(*marked)
	return entries, nil
}

// deliver hands one message to the subscription's channel and waits for its
// Ack or Nack, at most HandlerTimeout. With tx set (Transactional) the
// handler finds the transaction in the message context.
func (w *Worker) deliver(ctx context.Context, e logEntry, tx *txGuard) (got outcome, err error) {
	msg, d, cancel := w.newMessage(ctx, e, tx, w.countAttempt(e.seq))
	defer cancel() // a message's context ends with its Ack or Nack
	start := time.Now()
	defer func() { w.observe(d.span, got, err, 1, 0, time.Since(start)) }()
	w.lastMsg = msg

	select {
	case w.out <- msg:
		w.handedOut = true
	case <-ctx.Done():
		return stopped, nil
	}
	// One timer per worker, not per message (the hot path); since Go 1.23
	// Reset and Stop leave no stale tick in its channel.
	if w.timer == nil {
		w.timer = time.NewTimer(w.s.abandonAfter())
	} else {
		w.timer.Reset(w.s.abandonAfter())
	}
	timeout := w.timer
	defer timeout.Stop()
	done := ctx.Done()
	var grace <-chan time.Time
	for {
		select {
		case <-msg.Acked():
			return w.answer(d, acked, e, nil)
		case <-msg.Nacked():
			return w.answer(d, nacked, e, nil)
		case <-timeout.C:
			select { // an answer that raced with the timer wins
			case <-msg.Acked():
				return w.answer(d, acked, e, nil)
			case <-msg.Nacked():
				return w.answer(d, nacked, e, nil)
			default:
			}
			cancel()
			// The handler may still be running: it keeps its share of the
			// process's gate until it answers.
			w.abandonGate(msg.Acked(), msg.Nacked())
			reason := &errs.HandlerTimeoutError{Seq: e.seq, Timeout: w.s.HandlerTimeout}
			w.logger.Error("Handler timed out: the delivery counts as a failed attempt", reason, watermill.LogFields{"seq": e.seq, "attempt": w.attempts})
			if tx != nil {
				if w.exhausted() {
					// Dead-lettered once the transaction is given up:
					// counted as a rejection (observe), not a timeout.
					return timedOut, w.poison(reason)
				}
				return timedOut, reason
			}
			return w.answer(d, nacked, e, reason)
		case <-done:
			// The lease is ending: give the handler a moment to answer.
			done = nil
			grace = time.After(w.s.CloseTimeout)
		case <-grace:
			w.abandonGate(msg.Acked(), msg.Nacked())
			return stopped, nil
		}
	}
}

// abandonAfter is how long the Subscriber waits for a handler's answer:
// HandlerTimeout, when the handler's context ends, plus a tenth of it (at
// most a second), so that a handler that honours its context can still
// answer with its own error.
func (s *Config) abandonAfter() time.Duration {
	return s.HandlerTimeout + min(s.HandlerTimeout/10, time.Second)
}

// countAttempt returns the attempt number of a delivery of the message at
// seq. The head's deliveries were counted by read; a later message of the
// batch is on its first attempt unless it is the one that failed last.
func (w *Worker) countAttempt(seq int64) int {
	switch {
	case seq == w.headSeq:
		return max(w.attempts, 1)
	case seq < w.headSeq:
		return 1
	}
	w.headSeq, w.attempts, w.charged = seq, 1, 0
	w.firstFailure, w.lastFailure = time.Time{}, time.Time{}
	w.lastError = ""
	return 1
}

// newMessage builds the Watermill message for a log entry, with the
// outbox metadata and a context that carries the delivery handle (and the
// transaction, for the Transactional strategy) and ends at HandlerTimeout.
// cancel ends the context.
func (w *Worker) newMessage(ctx context.Context, e logEntry, tx *txGuard, attempt int) (*message.Message, *delivery, context.CancelFunc) {
	if tx != nil {
		ctx = pgexec.WithTx(ctx, pgx.Tx(tx))
	}
	ctx, cancel := context.WithTimeout(ctx, w.s.HandlerTimeout)
	msg, d := w.buildMessage(ctx, e, attempt)
	return msg, d, cancel
}

// buildMessage builds the Watermill message for a log entry on a context
// that already carries the transaction or deadline; it adds the delivery
// handle.
func (w *Worker) buildMessage(ctx context.Context, e logEntry, attempt int) (*message.Message, *delivery) {
	msg := message.NewMessage(e.uuid, e.payload)
	for k, v := range e.metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(MetadataTopic, w.topic)
	msg.Metadata.Set(MetadataPartition, strconv.Itoa(w.part))
	msg.Metadata.Set(MetadataSeq, strconv.FormatInt(e.seq, 10))
	msg.Metadata.Set(MetadataAttempt, strconv.Itoa(attempt))
	msg.Metadata.Set(MetadataID, StableID(w.topic, w.part, e.seq))
	if w.incarnation != "" {
		msg.Metadata.Set(MetadataIncarnation, w.incarnation)
	}
	if e.key != "" {
		msg.Metadata.Set(MetadataPartitionKey, e.key)
	}
	d := &delivery{}
	ctx, d.span = observe.StartProcess(ctx, msg, w.spanName, w.spanAttrs, e.seq, msg.Metadata.Get(MetadataID), attempt)
	msg.SetContext(context.WithValue(ctx, deliveryKey{}, d))
	return msg, d
}

// handleBatch gives the whole batch to the BatchHandler. With tx set, a
// batch that is not done entirely is undone entirely (its writes cannot be
// split), so nothing of it counts as done; adaptive degradation then
// shrinks the batch until the failing message stands alone.
func (w *Worker) handleBatch(ctx context.Context, entries []logEntry, tx *txGuard) (done int, result outcome, err error) {
	headAttempt := w.countAttempt(entries[0].seq)
	msgs := make([]*message.Message, len(entries))
	deliveries := make([]*delivery, len(entries))
	start := time.Now()
	defer func() {
		if done >= len(deliveries) {
			if c := w.s.Counts; c != nil {
				c.Acked.Add(int64(done))
			}
			if observe.Enabled() {
				observe.Current().Delivered(w.s.Group, w.topic, observe.Ack, done, time.Since(start))
			}
		}
		for i, d := range deliveries {
			if d == nil {
				continue
			}
			switch {
			case i < done:
				d.span.End(nil)
			case i == done:
				w.observe(d.span, result, err, 1, done, time.Since(start))
			default:
				d.span.End(errNotReached)
			}
		}
	}()
	// One context for the whole batch: one deadline, and the transaction
	// (Transactional), ended when the batch is done.
	bctx := ctx
	if tx != nil {
		bctx = pgexec.WithTx(ctx, pgx.Tx(tx))
	}
	bctx, cancel := context.WithTimeout(bctx, w.s.HandlerTimeout)
	defer cancel()
	for i, e := range entries {
		attempt := 1
		if i == 0 {
			attempt = headAttempt
		}
		msgs[i], deliveries[i] = w.buildMessage(bctx, e, attempt)
	}
	dctx, cancelDB := dbContext(ctx)
	defer cancelDB()
	if tx != nil {
		if _, err := tx.tx.Exec(dctx, w.s.Store.Savepoints().TxSavepointBatch); err != nil {
			w.handleErr = err
			return 0, stopped, nil
		}
	}
	w.handedOut = true
	var answered batchAnswer
	done, answered, err = w.callBatch(ctx, msgs)
	switch {
	case answered == batchTimedOut:
		cancel()
		reason := &errs.HandlerTimeoutError{Seq: entries[0].seq, Timeout: w.s.HandlerTimeout}
		if len(entries) > 1 {
			// Which message hung is unknown: retry them one at a time, so
			// that the one that hangs is charged, not the head.
			w.logger.Error("Batch handler timed out: retrying its messages one at a time", reason, watermill.LogFields{"seq": entries[0].seq, "batch": len(entries)})
			return 0, isolate, reason
		}
		w.logger.Error("Batch handler timed out: the delivery counts as a failed attempt", reason, watermill.LogFields{"seq": entries[0].seq, "attempt": w.attempts, "batch": len(entries)})
		if tx != nil {
			return 0, timedOut, reason
		}
		w.lastMsg = msgs[0]
		result, why := w.answer(&delivery{}, nacked, entries[0], reason)
		return 0, result, why
	case answered == batchGaveUp:
		return 0, stopped, nil
	}
	if tx != nil {
		if what := tx.takeMisuse(); what != "" {
			done, err = 0, &errs.TxMisuseError{Seq: entries[0].seq, What: what}
		} else if done >= len(entries) {
			if _, rerr := tx.tx.Exec(dctx, w.s.Store.Savepoints().TxReleaseBatch); rerr != nil {
				if connLost(tx) {
					w.handleErr = rerr
					return 0, stopped, nil
				}
				done, err = 0, &errs.TxMisuseError{Seq: entries[0].seq, What: misuseAborted, Cause: rerr}
			}
		}
	}
	if done >= len(entries) {
		return len(entries), acked, nil
	}
	if ctx.Err() != nil && err == nil {
		err = context.Cause(ctx)
	}
	if err == nil {
		err = fmt.Errorf("batch handler finished %d of %d messages without an error", done, len(entries))
	}
	if tx != nil {
		if _, rerr := tx.tx.Exec(dctx, w.s.Store.Savepoints().TxRollbackBatch); rerr != nil {
			if connLost(tx) {
				w.handleErr = rerr
				return 0, stopped, nil
			}
			return 0, broken, &errs.TxMisuseError{Seq: entries[0].seq, What: misuseEnded, Cause: rerr}
		}
		if done > 0 && w.iso != nil {
			// Commit the done prefix alone next, so that the failing
			// message is the head of a batch, and held back with its key.
			return done, isolate, err
		}
		if done > 0 {
			done = 0
			deliveries[0] = &delivery{} // the head was not the one that failed
		}
	}
	if done == 0 {
		w.lastMsg = msgs[0]
		result, reason := w.answer(deliveries[0], nacked, entries[0], err)
		return 0, result, reason
	}
	// A message after the head failed: it is retried as the next head.
	if rej, via, cause := deliveries[done].rejection(); rej && (via != nil || w.s.RejectHandler != nil) {
		w.lastMsg = msgs[done]
		w.countAttempt(entries[done].seq)
		w.rejectVia = w.s.RejectHandler
		if via != nil {
			w.rejectVia = via
		}
		return done, rejected, cause
	}
	return done, nacked, err
}

type batchAnswer int

const (
	batchAnswered batchAnswer = iota
	batchTimedOut             // no return within HandlerTimeout
	batchGaveUp               // no return within CloseTimeout after the lease ended
)

// callBatch runs the BatchHandler, turning a panic into an error, and waits
// for it at most HandlerTimeout (and CloseTimeout once the lease ends). A
// handler that does not return in time is left running on its own
// goroutine, which ends when it returns; its result is ignored.
func (w *Worker) callBatch(ctx context.Context, msgs []*message.Message) (int, batchAnswer, error) {
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
		done, err := w.batch(ctx, msgs)
		r = result{max(0, min(done, len(msgs))), err}
	}()
	timeout := time.NewTimer(w.s.abandonAfter())
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
			w.abandonGate(returned, nil) // (it keeps its share until it returns)
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

// answer turns an Ack, a Nack or a failure (reason) into an outcome: a
// Reject wins over all of them, and a message that failed MaxAttempts
// times is rejected. It sets rejectVia for a rejection.
func (w *Worker) answer(d *delivery, got outcome, e logEntry, reason error) (outcome, error) {
	isRejected, via, cause := d.rejection()
	if got == nacked || isRejected {
		now := time.Now()
		if w.firstFailure.IsZero() {
			w.firstFailure = now
		}
		w.lastFailure = now
	}
	w.rejectVia = w.s.RejectHandler
	if via != nil {
		w.rejectVia = via
	}
	canReject := w.rejectVia != nil
	switch {
	case isRejected && canReject:
		return rejected, cause
	case isRejected:
		warnlog.Warn("Message rejected but no RejectHandler is configured: retrying it (set SubscriberConfig.RejectHandler, e.g. a deadletter.Store, or reject with outbox.RejectTo)", watermill.LogFields{"seq": e.seq, "reason": cause}, w.logger)
		return nacked, cause
	case got == nacked && canReject && errors.As(reason, new(*exhaustedError)):
		return rejected, reason // (a timed-out Transactional delivery, already found exhausted)
	case got == nacked && canReject && w.exhausted():
		return rejected, w.poison(reason)
	}
	return got, reason
}

// exhausted reports whether a failure of the head now would be its
// MaxAttempts-th: its failed attempts recorded so far (failures, timeouts
// and crashes it caused alone), plus this one.
func (w *Worker) exhausted() bool {
	return w.s.MaxAttempts > 0 && w.charged+1 >= w.s.MaxAttempts
}

// poison is the reason of a rejection after MaxAttempts failures, the last
// one reason.
func (w *Worker) poison(reason error) error {
	if reason == nil {
		reason = errors.New("nacked")
	}
	return &exhaustedError{fmt.Errorf("%w: failed %d times (MaxAttempts), last: %w", errs.ErrPoison, min(w.charged+1, w.s.MaxAttempts), reason)}
}

// exhaustedError is the reason of a rejection after MaxAttempts failures,
// told apart from a handler's own ErrPoison (outbox.Reject), which names
// the message the handler rejects, not necessarily the head.
type exhaustedError struct{ err error }

func (e *exhaustedError) Error() string { return e.err.Error() }
func (e *exhaustedError) Unwrap() error { return e.err }

func (w *Worker) rejectedMessage(e logEntry, reason error) RejectedMessage {
	metadata := e.metadata
	if w.lastMsg != nil && w.lastMsg.UUID == e.uuid {
		metadata = make(map[string]string, len(w.lastMsg.Metadata))
		for k, v := range w.lastMsg.Metadata {
			metadata[k] = v
		}
	}
	return RejectedMessage{
		Group:        w.s.Group,
		Topic:        w.topic,
		Partition:    w.part,
		Seq:          e.seq,
		UUID:         e.uuid,
		PartitionKey: e.key,
		Metadata:     metadata,
		Payload:      e.payload,
		Reason:       reason,
		Attempts:     w.attempts,
		FirstFailure: w.firstFailure,
		LastFailure:  w.lastFailure,
	}
}

// rejectInOwnTx stores a rejected message and moves the cursor past it in
// one transaction of its own.
func (w *Worker) rejectInOwnTx(ctx context.Context, e logEntry, reason error) error {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	_, err := w.withBulkhead(dctx, func() ([]logEntry, error) {
		return nil, w.s.Store.InTx(dctx, func(tx pgx.Tx) error {
			via := w.rejectVia
			if via == nil {
				via = w.s.RejectHandler
			}
			if err := via.HandleReject(dctx, tx, w.rejectedMessage(e, reason)); err != nil {
				return fmt.Errorf("outbox: reject handler: %w", err)
			}
			q, _ := pgexec.FromTx(tx)
			return w.moveScan(dctx, q, e.seq)
		})
	})
	if err != nil {
		w.iso.abandoned()
		return err
	}
	w.iso.committed()
	w.cursor = e.seq
	return nil
}

// showState writes the adaptive state to the cursor row when it changed,
// for the admin status. It is fenced by the lease token and best effort.
func (w *Worker) showState(ctx context.Context) {
	state, size := w.mode.State(), w.mode.BatchSize()
	if state == w.shownState && size == w.shownSize {
		return
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	err := w.s.Store.SaveAdaptive(dctx, w.topic, w.part, w.lease.Token(), state.String(), size)
	if err != nil {
		w.logger.Debug("Cannot record adaptive state", watermill.LogFields{"state": state.String(), "size": size, "err": err})
		return
	}
	w.shownState, w.shownSize = state, size
}

// fmtErr keeps error text bounded for the cursor's last_error column.
func fmtErr(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if len(msg) > 2000 {
		return fmt.Errorf("%s…", msg[:2000])
	}
	return err
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

// gateError is what a turn returns when it could not take the process's
// delivery gate: nothing when its lease or the subscription ended (the
// loop stops), else err.
func gateError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// handleOrFail is handle for a batch whose messages all have their
// payloads; a message whose payload is missing (errs.ErrPayloadMissing)
// ends the batch before it, and when it is the first, fails without being
// handed out: a counted attempt, and after MaxAttempts a dead letter.
func (w *Worker) handleOrFail(ctx context.Context, deliver []logEntry, tx *txGuard) (int, outcome, error) {
	for i, e := range deliver {
		if !e.payloadMissing {
			continue
		}
		if i > 0 {
			return w.handle(ctx, deliver[:i], tx)
		}
		reason := &errs.PayloadMissingError{Topic: w.topic, Partition: w.part, Seq: e.seq}
		w.logger.Error("Message cannot be delivered: its payload is missing; counted as a failed attempt", reason, watermill.LogFields{"seq": e.seq, "attempt": w.attempts})
		w.answered()
		result, why := w.answer(&delivery{}, nacked, e, reason)
		if result == rejected {
			w.countRejected()
		}
		return 0, result, why
	}
	return w.handle(ctx, deliver, tx)
}
