package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
)

// Metadata the demo sets on each message, besides the partition key.
const (
	versionMetadata = "version" // the order's version after the transaction
	indexMetadata   = "index"   // the message's position in its transaction, from 1
)

// sent is a message the demo published, and what became of its transaction.
type sent struct {
	uuid        string
	key         string
	version     int64
	index       int
	committed   bool
	committedAt time.Time // when Commit returned; zero when rolled back
}

// publishResult is what the publish stage produced.
type publishResult struct {
	messages []sent
	counts   counters
	elapsed  time.Duration
}

// counters are running totals, read by the progress printer.
type counters struct {
	committedTx, committedMsgs   atomic.Int64
	rolledBackTx, rolledBackMsgs atomic.Int64
}

// publish runs the publishers until -messages messages are published. The
// sequencer, the forwarders and the brokers' consumers work meanwhile, and
// a progress line follows them all every second until every message has
// arrived (see awaitDelivered).
func (d *demo) publish(ctx context.Context) error {
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: d.pool}, d.logger)
	if err != nil {
		return err
	}
	defer pub.Close()

	res := &d.published
	d.publishStart = time.Now()
	d.startProgress()
	msgs, err := d.runPublishers(ctx, pub, &res.counts)
	res.elapsed = time.Since(d.publishStart)
	res.messages = msgs
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "   publishers done: %d messages in %d transactions in %s: %.0f msg/s\n",
		len(msgs), res.counts.committedTx.Load()+res.counts.rolledBackTx.Load(),
		res.elapsed.Round(time.Millisecond), float64(len(msgs))/res.elapsed.Seconds())
	return nil
}

// runPublishers runs d.cfg.publishers workers that share the message budget
// and returns every message they published. The first error stops them all.
func (d *demo) runPublishers(ctx context.Context, pub *outbox.Publisher, c *counters) ([]sent, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		claimed atomic.Int64
		mu      sync.Mutex
		all     []sent
		wg      sync.WaitGroup
	)
	for i := 0; i < d.cfg.publishers; i++ {
		w := &worker{cfg: d.cfg, db: d.pool, pub: pub, claimed: &claimed, counts: c}
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs, err := w.run(ctx)
			if err != nil {
				cancel(err)
			}
			mu.Lock()
			all = append(all, msgs...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all, context.Cause(ctx)
}

// beginner is what a worker needs from the pool.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// worker is one publisher: a loop of transactions, each updating one order
// and publishing 1–5 messages about it.
type worker struct {
	cfg     config
	db      beginner
	pub     *outbox.Publisher
	claimed *atomic.Int64 // messages claimed by all workers so far
	counts  *counters
	sent    []sent
}

func (w *worker) run(ctx context.Context) ([]sent, error) {
	for {
		n := w.claim()
		if n == 0 {
			return w.sent, nil
		}
		if err := w.transaction(ctx, n); err != nil {
			return w.sent, err
		}
	}
}

// claim takes up to 1–5 messages from the shared budget; 0 when it is spent.
func (w *worker) claim() int {
	n := int64(1 + rand.IntN(5))
	end := w.claimed.Add(n)
	start := end - n
	total := int64(w.cfg.messages)
	if start >= total {
		return 0
	}
	return int(min(end, total) - start)
}

// transaction updates a random order and publishes n messages about it in
// the same transaction, then commits or (sometimes) rolls back.
func (w *worker) transaction(ctx context.Context, n int) error {
	orderID := 1 + rand.IntN(w.cfg.keys)
	rollback := rand.Float64() < w.cfg.rollback

	tx, err := w.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // no-op after Commit

	// The UPDATE locks the order's row until the transaction ends, so the
	// transactions of one order run one after the other: their versions,
	// and their messages' places in the log, follow that order.
	var version int64
	err = tx.QueryRow(ctx, `UPDATE orders SET version = version + 1, updated_at = now()
		WHERE id = $1 RETURNING version`, orderID).Scan(&version)
	if err != nil {
		return fmt.Errorf("update order %d: %w", orderID, err)
	}

	key := strconv.Itoa(orderID)
	msgs := newMessages(outbox.WithTx(ctx, tx), key, version, n)
	if err := w.pub.Publish(topic, msgs...); err != nil {
		return err
	}

	var committedAt time.Time // where the commit→broker latency starts
	if rollback {
		if err := tx.Rollback(ctx); err != nil {
			return fmt.Errorf("rollback: %w", err)
		}
		w.counts.rolledBackTx.Add(1)
		w.counts.rolledBackMsgs.Add(int64(n))
	} else {
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		committedAt = time.Now()
		w.counts.committedTx.Add(1)
		w.counts.committedMsgs.Add(int64(n))
	}
	for i, m := range msgs {
		w.sent = append(w.sent, sent{uuid: m.UUID, key: key, version: version, index: i + 1,
			committed: !rollback, committedAt: committedAt})
	}
	return nil
}

// newMessages builds n messages about one order version, bound to the
// transaction carried by txCtx.
func newMessages(txCtx context.Context, key string, version int64, n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		payload := fmt.Sprintf(`{"order_id":%s,"version":%d,"index":%d}`, key, version, i+1)
		m := message.NewMessage(watermill.NewUUID(), []byte(payload))
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
		m.Metadata.Set(versionMetadata, strconv.FormatInt(version, 10))
		m.Metadata.Set(indexMetadata, strconv.Itoa(i+1))
		m.SetContext(txCtx)
		msgs[i] = m
	}
	return msgs
}
