package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/worker"
	"github.com/millrace/watermill-outbox/lease"
)

// partitionWorker delivers one partition of one topic to one subscription
// while its lease lasts.
type partitionWorker struct {
	s      *Subscriber
	topic  string
	part   int
	lease  *lease.Lease
	out    chan<- *message.Message
	mode   *adaptive.Mode
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

	// Failures of the message at the head of the partition (cursor+1).
	headSeq      int64
	attempts     int
	firstFailure time.Time
	lastFailure  time.Time
}

type logEntry struct {
	seq      int64
	uuid     string
	key      string
	metadata map[string]string
	payload  []byte
}

type outcome int

const (
	acked outcome = iota
	nacked
	rejected
	stopped // the lease or the subscription ended before an answer
)

func (s *Subscriber) newPartitionWorker(topic string, l *lease.Lease, out chan<- *message.Message) *partitionWorker {
	mode, _ := adaptive.NewMode(s.cfg.Tuning.ModeConfig()) // validated with the config
	return &partitionWorker{
		s:      s,
		topic:  topic,
		part:   l.Partition(),
		lease:  l,
		out:    out,
		mode:   mode,
		poker:  worker.NewPoker(),
		cursor: l.Cursor(),
		// Deliveries of the head message before this lease (other
		// instances, earlier leases) count towards its attempts.
		headSeq:  l.Cursor() + 1,
		attempts: l.Attempts(),
		logger:   s.logger.With(watermill.LogFields{"topic": topic, "partition": l.Partition()}),
	}
}

func (w *partitionWorker) run() {
	defer w.s.addPoker(w.topic, w.part, w.poker)()
	cfg := worker.Config{
		Name:    StableID(w.topic, w.part, 0),
		Pacing:  w.s.cfg.Tuning.Pacing,
		Backoff: worker.BackoffConfig{Base: w.s.cfg.Tuning.BackoffBase, Max: w.s.cfg.Tuning.BackoffMax},
		Poker:   w.poker,
		OnFailure: func(f worker.Failure) {
			if !leaseEnded(f.Err) {
				w.logger.Error("Partition worker failed, backing off", f.Err, watermill.LogFields{"retry_in": f.RetryIn})
			}
		},
	}
	action := worker.ActionFunc(w.executeLeased)
	if w.s.cfg.Strategy == Transactional {
		// The transaction holds a connection while the handler runs, so the
		// bulkhead covers the whole batch.
		cfg.Bulkhead = w.s.bulkhead
		action = w.executeTransactional
	}
	_ = worker.Run(w.lease.Context(), cfg, action)
}

// dbContext outlives the lease context by a little, so that work finished
// while a lease is being released (Close, rebalancing) is still recorded.
func dbContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}

// executeLeased runs one batch outside any transaction.
func (w *partitionWorker) executeLeased(ctx context.Context) (worker.Directive, error) {
	size := w.mode.BatchSize()
	entries, err := w.withBulkhead(ctx, func() ([]logEntry, error) { return w.read(ctx, w.s.db, size) })
	if err != nil || len(entries) == 0 {
		return worker.Idle(), err
	}
	processed, result, reason := w.handle(ctx, entries, nil)
	done := w.cursor
	if processed > 0 {
		done = entries[processed-1].seq
	}
	if result == rejected {
		if err := w.rejectInOwnTx(ctx, entries[processed], reason); err != nil {
			result, reason = nacked, err
		} else {
			done = entries[processed].seq
		}
	}
	if done > w.cursor {
		dctx, cancel := dbContext(ctx)
		defer cancel()
		advance := func() ([]logEntry, error) {
			if w.s.cfg.SyncCursorCommits {
				return nil, w.lease.Advance(dctx, w.s.db, done)
			}
			return nil, w.lease.AdvanceRelaxed(dctx, done)
		}
		if _, err := w.withBulkhead(dctx, advance); err != nil {
			return worker.Idle(), err
		}
		w.cursor = done
	}
	return w.settle(ctx, result, reason, processed, len(entries) == size, w.s.db)
}

// executeTransactional runs one batch in one transaction; the cursor moves
// in the same transaction, so the handlers' writes commit with it.
func (w *partitionWorker) executeTransactional(ctx context.Context) (_ worker.Directive, err error) {
	tx, err := w.s.cfg.Pool.Begin(ctx)
	if err != nil {
		return worker.Idle(), err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	q, _ := pgexec.FromTx(tx)
	size := w.mode.BatchSize()
	entries, err := w.read(ctx, q, size)
	if err != nil || len(entries) == 0 {
		if err == nil {
			err = tx.Rollback(ctx)
		}
		return worker.Idle(), err
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	processed, result, reason := w.handle(ctx, entries, tx)
	if err := w.takeHandleError(); err != nil {
		return worker.Idle(), err
	}
	done := w.cursor
	if processed > 0 {
		done = entries[processed-1].seq
	}
	if result == rejected {
		if err := w.s.cfg.RejectHandler.HandleReject(dctx, tx, w.rejectedMessage(entries[processed], reason)); err != nil {
			return worker.Idle(), fmt.Errorf("outbox: reject handler: %w", err)
		}
		done = entries[processed].seq
	}
	if done > w.cursor {
		if err := w.lease.Advance(dctx, q, done); err != nil {
			return worker.Idle(), err
		}
	}
	if result == nacked {
		if err := w.lease.RecordFailure(dctx, q, w.failure(reason)); err != nil {
			return worker.Idle(), err
		}
	}
	if err := tx.Commit(dctx); err != nil {
		return worker.Idle(), err
	}
	w.cursor = done
	return w.settle(ctx, result, reason, processed, len(entries) == size, nil)
}

// handle gives the batch to the subscription: one message at a time over
// the channel, or all at once to a BatchHandler. It returns how many
// entries from the start are done and how the next one (if any) ended:
// nacked, rejected, or stopped. With tx set (Transactional) it keeps the
// done prefix's writes and undoes the rest with savepoints.
func (w *partitionWorker) handle(ctx context.Context, entries []logEntry, tx pgx.Tx) (int, outcome, error) {
	if w.batch != nil {
		return w.handleBatch(ctx, entries, tx)
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	for i, e := range entries {
		if tx != nil {
			if _, err := tx.Exec(dctx, "SAVEPOINT outbox_delivery"); err != nil {
				w.handleErr = err
				return i, stopped, nil
			}
		}
		result, reason := w.deliver(ctx, e, tx)
		if result == acked {
			continue
		}
		if tx != nil {
			// Undo whatever the handler wrote for this message.
			if _, err := tx.Exec(dctx, "ROLLBACK TO SAVEPOINT outbox_delivery"); err != nil {
				w.handleErr = err
				return i, stopped, nil
			}
		}
		return i, result, reason
	}
	return len(entries), acked, nil
}

// takeHandleError returns (and clears) a database error met by handle.
func (w *partitionWorker) takeHandleError() error {
	err := w.handleErr
	w.handleErr = nil
	return err
}

// settle feeds the batch's outcome to the adaptive mode and picks the next
// step. failureQ, when set, records a nack on the cursor row.
func (w *partitionWorker) settle(ctx context.Context, result outcome, reason error, processed int, full bool, failureQ pgexec.Querier) (worker.Directive, error) {
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
		w.mode.Failed(processed)
		if failureQ != nil {
			dctx, cancel := dbContext(ctx)
			defer cancel()
			if err := w.lease.RecordFailure(dctx, failureQ, w.failure(reason)); err != nil && !leaseEnded(err) {
				w.logger.Error("Cannot record failure", err, nil)
			}
		}
		return worker.Sleep(w.mode.Backoff()), nil
	}
	return worker.Idle(), nil // stopped: the loop ends with the lease
}

func (w *partitionWorker) failure(reason error) error {
	if reason == nil {
		reason = errors.New("nacked")
	}
	return fmtErr(fmt.Errorf("seq %d, attempt %d: %w", w.headSeq, w.attempts, reason))
}

func (w *partitionWorker) withBulkhead(ctx context.Context, fn func() ([]logEntry, error)) ([]logEntry, error) {
	release, err := w.s.bulkhead.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return fn()
}

func (w *partitionWorker) read(ctx context.Context, q pgexec.Querier, limit int) ([]logEntry, error) {
	rows, err := q.Query(ctx, w.s.readSQL, w.topic, w.part, w.cursor, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	entries := make([]logEntry, 0, limit)
	for rows.Next() {
		var e logEntry
		if err := rows.Scan(&e.seq, &e.uuid, &e.key, &e.metadata, &e.payload); err != nil {
			return nil, err
		}
		entries = append(entries, e)
	}
	return entries, rows.Err()
}

// deliver hands one message to the subscription's channel and waits for its
// Ack or Nack. With tx set (Transactional) the handler finds the
// transaction in the message context.
func (w *partitionWorker) deliver(ctx context.Context, e logEntry, tx pgx.Tx) (outcome, error) {
	msg, d, cancel := w.newMessage(ctx, e, tx, w.countAttempt(e.seq))
	defer cancel() // a message's context ends with its Ack or Nack
	w.lastMsg = msg

	select {
	case w.out <- msg:
	case <-ctx.Done():
		return stopped, nil
	}
	done := ctx.Done()
	var grace <-chan time.Time
	for {
		select {
		case <-msg.Acked():
			return w.answer(d, acked, e)
		case <-msg.Nacked():
			return w.answer(d, nacked, e)
		case <-done:
			// The lease is ending: give the handler a moment to answer.
			done = nil
			grace = time.After(w.s.cfg.CloseTimeout)
		case <-grace:
			return stopped, nil
		}
	}
}

// countAttempt counts a delivery of the message at seq towards the
// attempts of the partition's head message, and returns its attempt number.
func (w *partitionWorker) countAttempt(seq int64) int {
	// A batch retried from an earlier message (a transaction undone as a
	// whole) must not forget the failures of the later head.
	if seq < w.headSeq && w.attempts > 0 {
		return 1
	}
	if seq != w.headSeq {
		w.headSeq, w.attempts = seq, 0
		w.firstFailure, w.lastFailure = time.Time{}, time.Time{}
	}
	w.attempts++
	return w.attempts
}

// newMessage builds the Watermill message for a log entry, with the
// outbox metadata and a context that carries the delivery handle (and the
// transaction, for the Transactional strategy). cancel ends the context.
func (w *partitionWorker) newMessage(ctx context.Context, e logEntry, tx pgx.Tx, attempt int) (*message.Message, *delivery, context.CancelFunc) {
	var cancel context.CancelFunc
	if tx != nil {
		ctx, cancel = context.WithCancel(WithTx(ctx, tx))
	} else {
		ctx, cancel = context.WithTimeout(ctx, w.s.cfg.HandlerTimeout)
	}
	msg, d := w.buildMessage(ctx, e, attempt)
	return msg, d, cancel
}

// buildMessage builds the Watermill message for a log entry on a context
// that already carries the transaction or deadline; it adds the delivery
// handle.
func (w *partitionWorker) buildMessage(ctx context.Context, e logEntry, attempt int) (*message.Message, *delivery) {
	msg := message.NewMessage(e.uuid, e.payload)
	for k, v := range e.metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(MetadataTopic, w.topic)
	msg.Metadata.Set(MetadataPartition, strconv.Itoa(w.part))
	msg.Metadata.Set(MetadataSeq, strconv.FormatInt(e.seq, 10))
	msg.Metadata.Set(MetadataAttempt, strconv.Itoa(attempt))
	msg.Metadata.Set(MetadataID, StableID(w.topic, w.part, e.seq))
	if e.key != "" {
		msg.Metadata.Set(MetadataPartitionKey, e.key)
	}
	d := &delivery{}
	msg.SetContext(context.WithValue(ctx, deliveryKey{}, d))
	return msg, d
}

// handleBatch gives the whole batch to the BatchHandler. With tx set, a
// batch that is not done entirely is undone entirely (its writes cannot be
// split), so nothing of it counts as done; adaptive degradation then
// shrinks the batch until the failing message stands alone.
func (w *partitionWorker) handleBatch(ctx context.Context, entries []logEntry, tx pgx.Tx) (int, outcome, error) {
	headAttempt := w.countAttempt(entries[0].seq)
	msgs := make([]*message.Message, len(entries))
	deliveries := make([]*delivery, len(entries))
	// One context for the whole batch: one deadline (Leased) or one
	// transaction (Transactional), ended when the batch is done.
	var bctx context.Context
	var cancel context.CancelFunc
	if tx != nil {
		bctx, cancel = context.WithCancel(WithTx(ctx, tx))
	} else {
		bctx, cancel = context.WithTimeout(ctx, w.s.cfg.HandlerTimeout)
	}
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
		if _, err := tx.Exec(dctx, "SAVEPOINT outbox_batch"); err != nil {
			w.handleErr = err
			return 0, stopped, nil
		}
	}
	done, err := w.callBatch(ctx, msgs)
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
		if _, rerr := tx.Exec(dctx, "ROLLBACK TO SAVEPOINT outbox_batch"); rerr != nil {
			w.handleErr = rerr
			return 0, stopped, nil
		}
		if done > 0 {
			done = 0
			deliveries[0] = &delivery{} // the head was not the one that failed
		}
	}
	if done == 0 {
		w.lastMsg = msgs[0]
		result, reason := w.answerBatch(deliveries[0], err, entries[0])
		return 0, result, reason
	}
	// A message after the head failed: it is retried as the next head.
	if rej, cause := deliveries[done].rejection(); rej && w.s.cfg.RejectHandler != nil {
		w.lastMsg = msgs[done]
		w.countAttempt(entries[done].seq)
		return done, rejected, cause
	}
	return done, nacked, err
}

// answerBatch classifies the failure of a batch's head message.
func (w *partitionWorker) answerBatch(d *delivery, err error, e logEntry) (outcome, error) {
	result, reason := w.answer(d, nacked, e)
	if result == nacked {
		reason = err
	}
	return result, reason
}

// callBatch runs the BatchHandler, turning a panic into an error.
func (w *partitionWorker) callBatch(ctx context.Context, msgs []*message.Message) (done int, err error) {
	defer func() {
		if r := recover(); r != nil {
			done, err = 0, fmt.Errorf("outbox: batch handler panicked: %v", r)
		}
	}()
	done, err = w.batch(ctx, msgs)
	return max(0, min(done, len(msgs))), err
}

// answer turns an Ack or Nack into an outcome: a Reject wins over both, and
// a message that failed MaxAttempts times is rejected.
func (w *partitionWorker) answer(d *delivery, got outcome, e logEntry) (outcome, error) {
	isRejected, cause := d.rejection()
	if got == nacked || isRejected {
		now := time.Now()
		if w.firstFailure.IsZero() {
			w.firstFailure = now
		}
		w.lastFailure = now
	}
	canReject := w.s.cfg.RejectHandler != nil
	switch {
	case isRejected && canReject:
		return rejected, cause
	case isRejected:
		w.logger.Info("Message rejected but no RejectHandler is configured: retrying it", watermill.LogFields{"seq": e.seq, "reason": cause})
		return nacked, cause
	case got == nacked && canReject && w.s.cfg.MaxAttempts > 0 && w.attempts >= w.s.cfg.MaxAttempts:
		return rejected, fmt.Errorf("%w: nacked %d times (MaxAttempts)", ErrPoison, w.attempts)
	}
	return got, nil
}

func (w *partitionWorker) rejectedMessage(e logEntry, reason error) RejectedMessage {
	metadata := e.metadata
	if w.lastMsg != nil && w.lastMsg.UUID == e.uuid {
		metadata = make(map[string]string, len(w.lastMsg.Metadata))
		for k, v := range w.lastMsg.Metadata {
			metadata[k] = v
		}
	}
	return RejectedMessage{
		Group:        w.s.cfg.ConsumerGroup,
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
// one transaction (Leased strategy).
func (w *partitionWorker) rejectInOwnTx(ctx context.Context, e logEntry, reason error) error {
	dctx, cancel := dbContext(ctx)
	defer cancel()
	release, err := w.s.bulkhead.Acquire(dctx)
	if err != nil {
		return err
	}
	defer release()
	err = pgx.BeginFunc(dctx, w.s.cfg.Pool, func(tx pgx.Tx) error {
		if err := w.s.cfg.RejectHandler.HandleReject(dctx, tx, w.rejectedMessage(e, reason)); err != nil {
			return fmt.Errorf("outbox: reject handler: %w", err)
		}
		q, _ := pgexec.FromTx(tx)
		return w.lease.Advance(dctx, q, e.seq)
	})
	if err == nil {
		w.cursor = e.seq
	}
	return err
}

// showState writes the adaptive state to the cursor row when it changed,
// for the admin status. It is fenced by the lease token and best effort.
func (w *partitionWorker) showState(ctx context.Context) {
	state, size := w.mode.State(), w.mode.BatchSize()
	if state == w.shownState && size == w.shownSize {
		return
	}
	dctx, cancel := dbContext(ctx)
	defer cancel()
	_, err := w.s.db.Exec(dctx, w.s.stateSQL, w.s.cfg.ConsumerGroup, w.topic, w.part, w.lease.Token(), state.String(), size)
	if err != nil {
		w.logger.Debug("Cannot record adaptive state", watermill.LogFields{"err": err})
		return
	}
	w.shownState, w.shownSize = state, size
}
