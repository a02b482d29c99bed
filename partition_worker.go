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
	done, processed := w.cursor, 0
	result, reason := acked, error(nil)
	for _, e := range entries {
		result, reason = w.deliver(ctx, e, nil)
		if result != acked {
			if result == rejected {
				if err := w.rejectInOwnTx(ctx, e, reason); err != nil {
					result, reason = nacked, err
				} else {
					done = e.seq
				}
			}
			break
		}
		done, processed = e.seq, processed+1
	}
	if done > w.cursor {
		dctx, cancel := dbContext(ctx)
		defer cancel()
		if _, err := w.withBulkhead(dctx, func() ([]logEntry, error) { return nil, w.lease.Advance(dctx, w.s.db, done) }); err != nil {
			return worker.Idle(), err
		}
		w.cursor = done
	}
	return w.settle(ctx, result, reason, processed, len(entries) == size, w.s.db)
}

// executeTransactional runs one batch in one transaction, with a savepoint
// per message; the cursor moves in the same transaction.
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
	done, processed := w.cursor, 0
	result, reason := acked, error(nil)
	for _, e := range entries {
		if _, err := tx.Exec(dctx, "SAVEPOINT outbox_delivery"); err != nil {
			return worker.Idle(), err
		}
		result, reason = w.deliver(ctx, e, tx)
		if result == acked {
			done, processed = e.seq, processed+1
			continue
		}
		// Undo whatever the handler wrote for this message.
		if _, err := tx.Exec(dctx, "ROLLBACK TO SAVEPOINT outbox_delivery"); err != nil {
			return worker.Idle(), err
		}
		if result == rejected {
			if err := w.s.cfg.RejectHandler.HandleReject(dctx, tx, w.rejectedMessage(e, reason)); err != nil {
				return worker.Idle(), fmt.Errorf("outbox: reject handler: %w", err)
			}
			done = e.seq
		}
		break
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
	if e.seq != w.headSeq {
		w.headSeq, w.attempts = e.seq, 0
		w.firstFailure, w.lastFailure = time.Time{}, time.Time{}
	}
	w.attempts++

	msg := message.NewMessage(e.uuid, e.payload)
	for k, v := range e.metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(MetadataTopic, w.topic)
	msg.Metadata.Set(MetadataPartition, strconv.Itoa(w.part))
	msg.Metadata.Set(MetadataSeq, strconv.FormatInt(e.seq, 10))
	msg.Metadata.Set(MetadataAttempt, strconv.Itoa(w.attempts))
	msg.Metadata.Set(MetadataID, StableID(w.topic, w.part, e.seq))

	d := &delivery{}
	hctx := context.WithValue(ctx, deliveryKey{}, d)
	var cancel context.CancelFunc
	if tx != nil {
		hctx, cancel = context.WithCancel(WithTx(hctx, tx))
	} else {
		hctx, cancel = context.WithTimeout(hctx, w.s.cfg.HandlerTimeout)
	}
	defer cancel() // a message's context ends with its Ack or Nack
	msg.SetContext(hctx)
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
