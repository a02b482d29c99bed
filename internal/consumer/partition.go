package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/internal/worker"
)

// Worker delivers one partition of one topic to one subscription while its
// lease lasts. Each turn (turn, scan) reads a batch after the cursor,
// hands it out, and settles its outcome (settle.go): the cursor moves past
// what is done, a rejected message goes to the RejectHandler, a failure is
// recorded with its backoff.
type Worker struct {
	// Fixed for the worker's life.
	s           *Config
	topic       string
	part        int
	lease       Lease
	out         chan<- *message.Message // Subscribe
	batch       BatchHandler            // ConsumeBatches (then out is nil)
	poker       *worker.Poker
	logger      watermill.LoggerAdapter
	incarnation string               // the topic's MetadataIncarnation ("" when unknown)
	spanName    string               // shared by the trace spans of its deliveries
	spanAttrs   []attribute.KeyValue //
	mode        Policy               // adaptive batching (its own state)

	// What changes from turn to turn: where it stands (progress.go, the
	// only code that changes it), and the rest.
	progress
	shown          shownState    // the adaptive state last written to the cursor row
	initialBackoff time.Duration // what was left of the backoff at acquisition, taken once
	gate           *Gate         // the process's delivery gate (Config.Gate)
	gateHold       *gateHold     // the delivery's hold on it
	iso            *isolation    // key isolation's held state (nil: off)
	timer          *time.Timer   // bounds the wait for a handler's answer
	abandonAfter   time.Duration // how long that wait is (Config.abandonAfter)
}

// shownState is the adaptive state last written to the cursor row.
type shownState struct {
	state tune.State
	size  int
}

// span is a range of seqs; the zero span is empty.
type span struct{ from, to int64 }

// covers reports whether seq is in the span.
func (s span) covers(seq int64) bool { return s.to > 0 && seq >= s.from && seq <= s.to }

// NewWorker creates the worker of the partition l leases, delivering to out
// one message at a time, or to batch when it is not nil (ConsumeBatches).
func NewWorker(s *Config, topic, incarnation string, l Lease, out chan<- *message.Message, batch BatchHandler) *Worker {
	mode, _ := tune.NewMode(s.Tuning.ModeConfig()) // validated with the config
	for range min(l.Attempts(), 32) {
		mode.Failed(0) // keep the backoff level across restarts and moves
	}
	w := &Worker{
		s:              s,
		topic:          topic,
		part:           l.Partition(),
		lease:          l,
		out:            out,
		batch:          batch,
		poker:          worker.NewPoker(),
		logger:         s.Logger.With(watermill.LogFields{"topic": topic, "partition": l.Partition()}),
		incarnation:    incarnation,
		spanName:       topic + " process",
		spanAttrs:      observe.ProcessAttributes(s.Group, topic, l.Partition()),
		mode:           mode,
		progress:       newProgress(l, s.MaxAttempts),
		initialBackoff: l.Backoff(),
		gate:           s.Gate,
		abandonAfter:   s.abandonAfter(),
		iso:            newIsolation(s.Isolation, l.Charged()),
	}
	if w.gate == nil {
		w.gate = processGate
	}
	w.noteCrash(l)
	return w
}

// noteCrash reports what the lease's acquisition found of a consumer
// process that died mid-delivery, and turns careful mode on.
func (w *Worker) noteCrash(l Lease) {
	if l.Charged() > 0 || l.UnexplainedCrash() || w.suspects.to > 0 {
		w.s.Careful.Extend() // a consumer process of the group died: be careful for a while
	}
	if n := l.Charged(); n > 0 {
		observe.Current().Crashed(w.s.Group, w.topic, n)
		if w.s.Counts != nil {
			w.s.Counts.Crashed.Add(int64(n))
		}
		w.logger.Error("A delivery ended without an outcome while it was the only one in flight in its process: counted as a failed attempt", nil, watermill.LogFields{
			"seq": w.ledger.seq, "charged": n, "attempts": l.Attempts(), "max_attempts": w.s.MaxAttempts,
			"hint": "the consumer process died, was killed or lost its lease while handling this message alone"})
	}
	if l.UnexplainedCrash() {
		w.logger.Error("Deliveries ended without an outcome while others were in flight in the same process: nobody is charged; delivering them alone to find the one that crashes it", nil, watermill.LogFields{
			"suspects_from": w.suspects.from, "suspects_to": w.suspects.to,
			"hint": "the consumer process died, was killed or lost its lease"})
	}
}

// Run delivers until the lease ends.
func (w *Worker) Run() {
	if w.s.Register != nil {
		defer w.s.Register(w.topic, w.part, w.poker)()
	}
	cfg := worker.Config{
		Name:   StableID(w.topic, w.part, 0),
		Pacing: w.s.Tuning.Pacing,
		// A database error backs off with jitter, as a handler's failure
		// does (noteFailure): the partitions an outage failed together do
		// not all retry at the same instant.
		Backoff: worker.BackoffConfig{Base: w.s.Tuning.BackoffBase, Max: w.s.Tuning.BackoffMax, Jitter: w.jitter},
		Poker:   w.poker,
		OnFailure: func(f worker.Failure) {
			if !leaseEnded(f.Err) {
				w.logger.Error("Partition worker failed, backing off", f.Err, watermill.LogFields{"seq": w.cursor + 1, "retry_in": f.RetryIn})
			}
		},
	}
	if w.s.Transactional {
		// The transaction holds a connection while the handler runs, so the
		// bulkhead covers the whole turn.
		cfg.Bulkhead = w.s.Bulkhead
	}
	_ = worker.Run(w.lease.Context(), cfg, worker.ActionFunc(w.Step))
	w.Stop()
}

// Partition is the partition the worker delivers.
func (w *Worker) Partition() int { return w.part }

// Step runs one turn of the worker in the caller's goroutine, the turn Run
// repeats (for a caller that drives delivery itself: outboxtest's
// synchronous runner). Proceed: more is waiting; Idle: nothing to do (or a
// held key's retry is due later); Sleep: backing off. An error is what Run
// would back off from; an error matching lease.ErrLeaseLost when the lease
// ended.
func (w *Worker) Step(ctx context.Context) (worker.Directive, error) {
	if w.iso != nil {
		return w.isolatedTurn(ctx)
	}
	if d := w.takeInitialBackoff(); d > 0 {
		return worker.Sleep(d), nil
	}
	return w.scan(ctx)
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

// scan is one batch: read it after the cursor, sort out what is not to be
// delivered, hand the rest out, settle the outcome. Both strategies take
// this path; the Transactional one opens the batch's transaction for the
// hand-out (scope), and settles in it.
func (w *Worker) scan(ctx context.Context) (worker.Directive, error) {
	defer w.releaseGate()
	size := w.mode.BatchSize()
	// The gate before the bulkhead: a worker waiting for the gate must not
	// hold a slot that a delivery in flight needs to record its outcome.
	if err := w.takeGate(ctx); err != nil {
		return worker.Idle(), gateError(ctx, err)
	}
	entries, err := w.withBulkhead(ctx, func() ([]Entry, error) { return w.read(ctx, size) })
	if err != nil || len(entries) == 0 {
		return worker.Idle(), err
	}
	b, end, settled := w.triage(ctx, batch{deliver: entries, full: len(entries) == size || w.suspects.to > 0})
	if settled {
		return end.dir, end.err
	}
	sc, err := w.openScope(ctx)
	if err != nil {
		w.undoDelivery(ctx)
		return worker.Idle(), err
	}
	defer sc.close(ctx)
	h := w.handle(ctx, b.deliver, sc.guard())
	return w.settle(ctx, sc, b, h)
}

// batch is what a scan read and delivers.
type batch struct {
	deliver []Entry
	full    bool  // as many as the batch size: more are likely waiting
	scanEnd int64 // key isolation: the last seq the scan covers (parked ones included)
}

// turnEnd is a turn's result when it ends early.
type turnEnd struct {
	dir worker.Directive
	err error
}

// triage takes a batch read after the cursor and returns what to deliver
// of it: with key isolation it sorts out what waits behind a held key
// (isolateBatch), and it takes out a head that has had its MaxAttempts.
// settled reports that the batch is settled, with the turn's end.
func (w *Worker) triage(ctx context.Context, b batch) (_ batch, _ turnEnd, settled bool) {
	first := b.deliver[0].Seq
	if w.iso != nil {
		var end turnEnd
		if b, end, settled = w.isolateBatch(ctx, b); settled {
			return b, end, true
		}
	}
	if head := b.deliver[0]; head.Seq == first && w.exhaustedHead(head) {
		return b, turnEnd{dir: w.rejectExhaustedHead(ctx, head)}, true
	}
	return b, turnEnd{}, false
}

// read reads the next batch after the cursor and, in the same statement,
// records on the cursor row, fenced by the lease, a delivery of the head
// message (cursor+1) and what is in flight (the whole batch, or the head
// alone when each message is recorded on its own, and whether it holds the
// process's gate alone), before anything is handed out: a delivery that
// ends without an outcome (a crash) is then settled by the next holder of
// the lease. The caller holds the gate (takeGate). A suspect head is read
// alone; a batch stops before the first suspect.
func (w *Worker) read(ctx context.Context, limit int) ([]Entry, error) {
	head := w.cursor + 1
	limit = w.readLimit(limit)
	entries, counted, err := w.s.Store.Read(ctx, w.topic, w.part, w.cursor, limit, w.lease, !w.marksEach(), w.alone())
	if err != nil {
		return nil, err
	}
	if len(entries) > 0 {
		observe.Current().Batch(w.s.Group, w.topic, len(entries))
		if w.s.Counts != nil {
			w.s.Counts.Batches.Add(1)
		}
	}
	if len(entries) == 0 || entries[0].Seq != head {
		return entries, nil // (a cursor behind the retained log has no head to count)
	}
	if counted == nil {
		// The fenced count changed nothing: the lease is gone, or the
		// cursor was moved under it.
		return nil, w.lease.Verify(ctx, "count a delivery", w.cursor)
	}
	w.ledger.counted(head, int(*counted))
	return entries, nil
}

// exhaustedHead reports whether MaxAttempts of the head's deliveries have
// failed — a delivery that was the only one in flight in a process that
// died included (see migrations/0009_crash_evidence.sql) — and a
// RejectHandler can take it out.
func (w *Worker) exhaustedHead(head Entry) bool {
	return w.s.RejectHandler != nil && head.Seq == w.ledger.seq && w.ledger.used()
}

// rejectExhaustedHead takes the exhausted head message out without
// delivering it (exhaustedHead).
func (w *Worker) rejectExhaustedHead(ctx context.Context, head Entry) worker.Directive {
	last := w.ledger.lastError
	if last == "" {
		last = "no error recorded"
	}
	w.ledger.uncount() // this delivery, counted by the read, does not happen
	reason := fmt.Errorf("%w: delivered %d times without success (MaxAttempts %d), a crash of its consumer process while it was the only delivery in flight included; last error: %s",
		sentinel.ErrPoison, w.ledger.deliveries, w.s.MaxAttempts, last)
	if err := w.rejectInOwnTx(ctx, head, reason, w.s.RejectHandler, nil); err != nil {
		if leaseEnded(err) {
			return worker.Idle()
		}
		delay := w.noteFailure(0)
		w.recordRetry(ctx, nil, err, delay)
		w.showState(ctx)
		return worker.Sleep(delay)
	}
	w.logger.Error("Message taken out of the stream after MaxAttempts", reason, watermill.LogFields{"seq": head.Seq})
	w.countRejected()
	w.mode.Rejected(0)
	w.showState(ctx)
	return worker.Proceed()
}

// takeInitialBackoff returns, once, what was left of the backoff recorded
// on the cursor row when the lease was acquired: a restart or a lease move
// does not retry a failing message early.
func (w *Worker) takeInitialBackoff() time.Duration {
	d := w.initialBackoff
	w.initialBackoff = 0
	return d
}

// undoDelivery takes back the delivery in flight, counted by the read,
// when it never reached a handler (or the worker stops).
func (w *Worker) undoDelivery(ctx context.Context) {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if err := w.lease.UndoDelivery(dctx, w.cursor); err != nil {
		w.logger.Debug("Cannot take back a delivery count", watermill.LogFields{"seq": w.cursor + 1, "err": err})
		return
	}
	if w.ledger.seq == w.cursor+1 {
		w.ledger.uncount()
	}
}

// noteFailure feeds a failed batch (processed messages done before the
// failure) to the adaptive mode and returns how long to wait before the
// retry: the mode's exponential backoff with jitter (internal/backoff), so
// that partitions failing together do not retry in lockstep.
func (w *Worker) noteFailure(processed int) time.Duration {
	w.mode.Failed(processed)
	return w.jitter(w.mode.Backoff())
}

// jitter spreads a backoff: Config.Jitter, or backoff.Jitter.
func (w *Worker) jitter(d time.Duration) time.Duration {
	if w.s.Jitter != nil {
		return w.s.Jitter(d)
	}
	return backoff.Jitter(d)
}

// showState writes the adaptive state to the cursor row when it changed,
// for the admin status. It is fenced by the lease token and best effort.
func (w *Worker) showState(ctx context.Context) {
	now := shownState{w.mode.State(), w.mode.BatchSize()}
	if now == w.shown {
		return
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	if err := w.s.Store.SaveAdaptive(dctx, w.topic, w.part, w.lease.Token(), now.state.String(), now.size); err != nil {
		w.logger.Debug("Cannot record adaptive state", watermill.LogFields{"state": now.state.String(), "size": now.size, "err": err})
		return
	}
	w.shown = now
}

// withBulkhead runs fn in a slot of the bulkhead that bounds the
// partitions querying at once. The Transactional strategy holds one for its
// whole turn (worker.Config.Bulkhead), so fn runs in that one: a second
// would wait for ever once every slot is held by a turn asking for one.
func (w *Worker) withBulkhead(ctx context.Context, fn func() ([]Entry, error)) ([]Entry, error) {
	if w.s.Transactional || w.s.Bulkhead == nil {
		return fn()
	}
	release, err := w.s.Bulkhead.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return fn()
}

// leaseEnded reports an error that only says the lease is gone: the worker
// stops, and the next holder goes on from the cursor.
func leaseEnded(err error) bool { return errors.Is(err, lease.ErrLeaseLost) }

// dbContext outlives the lease context by a little, so that work finished
// while a lease is being released (Close, rebalancing) is still recorded.
func dbContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
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
