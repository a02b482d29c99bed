package direct

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/forward"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// A round: reconcile what needs it, one read, one Kafka round, one record.

// round runs one round over the held partitions. It returns how many
// messages it recorded forwarded (or rejected), and whether a partition's
// read came back full (a backlog: the next round should not wait for a
// notification).
func (l *Loop) round(ctx context.Context) (n int, full bool) {
	now := time.Now()
	parts := l.held(now)
	ready := parts[:0:0]
	for _, x := range parts {
		if x.reconcile && !l.reconcile(ctx, x) {
			continue
		}
		ready = append(ready, x)
	}
	if len(ready) == 0 || ctx.Err() != nil {
		return 0, false
	}
	batches, err := l.read(ctx, ready, now)
	if err != nil {
		l.logger.Error("Cannot read the forwarder-only topic's pending messages", err, nil)
		l.readFailed(ready, fmt.Errorf("read pending: %w", err))
		return 0, false
	}
	if len(batches) == 0 {
		return 0, false
	}
	bs := make([]*Batch, len(batches))
	for i, b := range batches {
		bs[i] = &b.Batch
		full = full || len(b.Messages) >= l.cfg.BatchSize
	}
	start := time.Now()
	sendCtx, cancel := context.WithTimeout(ctx, l.cfg.SendTimeout)
	l.cfg.Target.SendRound(sendCtx, l.cfg.TargetTopic, bs)
	cancel()
	l.observe(batches, time.Since(start))
	// What Kafka took is recorded even when the Forwarder is closing, so
	// that the next owner has nothing to reconcile.
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.SendTimeout)
	defer cancel()
	n = l.record(recordCtx, batches)
	if l.compact != nil && n > 0 && l.runCtx != nil {
		l.compact.Moved(l.runCtx, n)
	}
	return n, full
}

// observe reports a round's sends to the metrics, per partition.
func (l *Loop) observe(batches []*readBatch, took time.Duration) {
	if !observe.Enabled() {
		return
	}
	for _, b := range batches {
		n := max(0, min(b.Done, len(b.Messages)))
		observe.Current().Forwarded(l.cfg.Source, l.cfg.TargetTopic, n, forward.MessageBytes(b.Messages[:n]), took, forward.ErrorKind(context.Background(), b.Err))
	}
}

// reconcile makes x's cursor say what Kafka holds (see the package
// comment); false: x is not ready this round.
func (l *Loop) reconcile(ctx context.Context, x *part) bool {
	held, err := l.cfg.Target.Reconcile(x.l.Context(), l.origin(x), l.cfg.TargetTopic, x.cursor)
	if err != nil {
		l.failed(x, fmt.Errorf("reconcile with Kafka: %w", err))
		return false
	}
	if len(held) > 0 {
		ids := make([]int64, len(held))
		for i, h := range held {
			ids[i] = h.PendingID
		}
		last := held[len(held)-1].Seq
		moved, err := l.forwarded(ctx, nil, []*part{x}, []int64{last}, [][]int64{ids})
		if err != nil {
			l.failed(x, err)
			return false
		}
		if !moved[x.l.Partition()] {
			l.drop(x)
			return false
		}
		l.logger.Info("Kafka held messages of a forwarder-only partition the cursor had not moved past (a previous owner committed them and stopped before recording them): recorded them forwarded", watermill.LogFields{
			"partition": x.l.Partition(), "from_seq": x.cursor + 1, "to_seq": last,
		})
		x.cursor = last
		l.mu.Lock()
		l.cnt.Reconciled += int64(len(held))
		l.mu.Unlock()
	}
	x.reconcile = false
	return true
}

// failed notes a failure of partition x: it is reconciled before its
// next read, after a backoff that doubles with its failures in a row,
// recorded on its cursor row (last error and retry time, as a
// Subscriber's are: status and the console show them).
func (l *Loop) failed(x *part, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.l.Context()), l.cfg.SendTimeout)
	defer cancel()
	l.backOff(ctx, x, err, true, true)
}

// readFailed notes that the read of the ready partitions failed: nothing
// was sent, so none needs reconciling, but each backs off and records the
// failure on its cursor row (as failed does; all of them within one
// SendTimeout, and none more once a record fails: the database is likely
// what failed).
func (l *Loop) readFailed(ready []*part, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.SendTimeout)
	defer cancel()
	record := true
	for _, x := range ready {
		record = l.backOff(ctx, x, err, false, record) && record
	}
}

// backOff puts x's next read after a backoff that doubles with its
// failures in a row, flags it for reconciling when reconcile is set, and
// records err and the retry time on its cursor row when record is set. It
// reports whether the record was written (or the lease found lost).
func (l *Loop) backOff(ctx context.Context, x *part, err error, reconcile, record bool) bool {
	if errors.Is(err, lease.ErrLeaseLost) || x.l.Context().Err() != nil {
		l.drop(x)
		return true
	}
	x.failures++
	retryIn := tune.ExponentialBackoff(l.cfg.BackoffBase, l.cfg.BackoffMax, x.failures)
	l.logger.Info("Forwarding a forwarder-only partition failed: it is retried (reconciled with Kafka first when a send may have happened)", watermill.LogFields{
		"partition": x.l.Partition(), "err": err.Error(), "retry_in": retryIn,
	})
	x.reconcile = x.reconcile || reconcile
	x.waitUntil = time.Now().Add(retryIn)
	l.mu.Lock()
	l.cnt.Failures++
	l.mu.Unlock()
	if !record {
		return false
	}
	if rerr := x.l.RecordRetry(ctx, nil, err, retryIn); rerr != nil {
		if errors.Is(rerr, lease.ErrLeaseLost) {
			l.drop(x)
			return true
		}
		l.logger.Error("Cannot record the failure on the cursor row", rerr, watermill.LogFields{"partition": x.l.Partition()})
		return false
	}
	return true
}

// readBatch is a Batch and what recording it needs.
type readBatch struct {
	Batch
	x   *part
	ids []int64 // the pending ids of Messages
}

// read reads every ready partition's next messages in one statement and
// numbers them from each partition's cursor.
func (l *Loop) read(ctx context.Context, ready []*part, now time.Time) ([]*readBatch, error) {
	partitions := make([]int32, len(ready))
	byPart := make(map[int]*part, len(ready))
	for i, x := range ready {
		partitions[i] = int32(x.l.Partition())
		byPart[x.l.Partition()] = x
	}
	rows, err := l.store.ReadPending(ctx, l.cfg.Topic, partitions, l.cfg.BatchSize, now)
	if err != nil {
		return nil, err
	}
	var out []*readBatch
	var cur *readBatch
	for _, r := range rows {
		p, id, uuid, key, meta, payload := int32(r.Partition), r.ID, r.UUID, r.Key, r.Metadata, r.Payload
		x := byPart[int(p)]
		if x == nil {
			return nil, fmt.Errorf("direct: the read returned partition %d, not one of %v", p, partitions)
		}
		if cur == nil || cur.x != x {
			cur = &readBatch{x: x, Batch: Batch{From: l.origin(x)}}
			out = append(out, cur)
		}
		seq := x.cursor + int64(len(cur.Messages)) + 1
		msg := message.NewMessage(uuid, payload)
		for k, v := range meta {
			msg.Metadata.Set(k, v)
		}
		msg.Metadata.Set(consumer.MetadataTopic, l.cfg.Topic)
		msg.Metadata.Set(consumer.MetadataPartition, strconv.Itoa(int(p)))
		msg.Metadata.Set(consumer.MetadataSeq, strconv.FormatInt(seq, 10))
		msg.Metadata.Set(consumer.MetadataID, consumer.StableID(l.cfg.Topic, int(p), seq))
		msg.Metadata.Set(consumer.MetadataAttempt, "1")
		if key != "" {
			msg.Metadata.Set(consumer.MetadataPartitionKey, key)
		}
		if l.cfg.Incarnation != "" {
			msg.Metadata.Set(consumer.MetadataIncarnation, l.cfg.Incarnation)
		}
		msg.Metadata.Set(MetadataPendingID, strconv.FormatInt(id, 10))
		if l.cfg.Prepare != nil {
			l.cfg.Prepare(msg)
		}
		cur.Messages = append(cur.Messages, msg)
		cur.ids = append(cur.ids, id)
	}
	return out, nil
}

// record ends a round: each partition's cursor moves past what Kafka
// took (and past a message it rejected, dead-lettered in the same
// transaction), and those rows leave pending. It returns the messages
// recorded forwarded or rejected.
func (l *Loop) record(ctx context.Context, batches []*readBatch) int {
	var (
		parts []*part
		lasts []int64
		ids   [][]int64
		rej   []outboxtype.RejectedMessage
		fails []*readBatch
	)
	for _, b := range batches {
		n := max(0, min(b.Done, len(b.Messages)))
		poison := b.Err != nil && n < len(b.Messages) && errors.Is(b.Err, sentinel.ErrPoison)
		end := n
		if poison {
			end = n + 1
			m := b.Messages[n]
			rej = append(rej, outboxtype.RejectedMessage{
				Group: l.cfg.Group, Topic: l.cfg.Topic, Partition: b.x.l.Partition(), Seq: b.x.cursor + int64(end), UUID: m.UUID,
				PartitionKey: m.Metadata.Get(consumer.MetadataPartitionKey), Metadata: map[string]string(m.Metadata), Payload: m.Payload,
				Reason: b.Err, Attempts: 1, FirstFailure: time.Now(), LastFailure: time.Now(),
			})
		}
		if b.Err != nil && !poison {
			fails = append(fails, b)
		}
		if end == 0 {
			continue
		}
		parts = append(parts, b.x)
		lasts = append(lasts, b.x.cursor+int64(end))
		ids = append(ids, b.ids[:end])
	}
	recorded := 0
	if len(parts) > 0 {
		moved, err := l.commit(ctx, parts, lasts, ids, rej)
		for i, x := range parts {
			switch {
			case err != nil:
				l.failed(x, fmt.Errorf("record the round forwarded: %w", err))
			case !moved[x.l.Partition()]:
				l.drop(x) // the lease is gone: its next owner reconciles it
			default:
				recorded += int(lasts[i] - x.cursor)
				x.cursor = lasts[i]
				if !slices.ContainsFunc(fails, func(b *readBatch) bool { return b.x == x }) {
					x.failures = 0
				}
			}
		}
		if err != nil {
			rej = nil
		}
	}
	// After the moves, which clear a cursor row's last error.
	for _, b := range fails {
		l.failed(b.x, b.Err)
	}
	l.mu.Lock()
	l.cnt.Rounds++
	l.cnt.Messages += int64(recorded - len(rej))
	l.cnt.Rejected += int64(len(rej))
	l.mu.Unlock()
	return recorded
}

// commit records parts forwarded to lasts, their rows ids gone, rej
// dead-lettered, and returns the partitions it moved: without dead letters
// in one statement of its own; with them in one transaction, which a
// partition whose lease is gone rolls back whole (nothing moved).
func (l *Loop) commit(ctx context.Context, parts []*part, lasts []int64, ids [][]int64, rej []outboxtype.RejectedMessage) (map[int]bool, error) {
	if len(rej) == 0 {
		return l.forwarded(ctx, nil, parts, lasts, ids)
	}
	tx, err := l.store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, m := range rej {
		if err := l.cfg.RejectHandler.HandleReject(ctx, tx, m); err != nil {
			return nil, fmt.Errorf("dead-letter %s/%d/%d: %w", m.Topic, m.Partition, m.Seq, err)
		}
	}
	moved, err := l.forwarded(ctx, tx, parts, lasts, ids)
	if err != nil {
		return nil, err
	}
	if len(moved) != len(parts) {
		return map[int]bool{}, nil
	}
	return moved, tx.Commit(ctx)
}

// forwarded records parts forwarded to lasts in tx (Store.Forwarded) and
// returns the partitions whose cursor moved.
func (l *Loop) forwarded(ctx context.Context, tx pgx.Tx, parts []*part, lasts []int64, ids [][]int64) (map[int]bool, error) {
	if len(parts) == 0 {
		return map[int]bool{}, nil
	}
	moves := make([]Move, len(parts))
	for i, x := range parts {
		moves[i] = Move{Partition: x.l.Partition(), Token: x.l.Token(), Last: lasts[i], IDs: ids[i]}
	}
	return l.store.Forwarded(ctx, tx, l.cfg.Group, l.cfg.Topic, parts[0].l.Owner(), moves)
}
