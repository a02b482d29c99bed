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
	uuid      string
	key       string
	version   int64
	index     int
	committed bool
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

// publish runs the publishers until -messages messages are published, with
// a sequencer running meanwhile, and prints progress every second.
func (d *demo) publish(ctx context.Context) error {
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: d.pool}, d.logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	if err := d.startSequencer(); err != nil {
		return err
	}

	res := &d.published
	stopProgress := d.printProgress(&res.counts)
	start := time.Now()
	msgs, err := d.runPublishers(ctx, pub, &res.counts)
	res.elapsed = time.Since(start)
	res.messages = msgs
	stopProgress()
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "   published %d messages in %d transactions in %s: %.0f msg/s\n",
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
		w.counts.committedTx.Add(1)
		w.counts.committedMsgs.Add(int64(n))
	}
	for i, m := range msgs {
		w.sent = append(w.sent, sent{uuid: m.UUID, key: key, version: version, index: i + 1, committed: !rollback})
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
		m.Metadata.Set(outbox.PartitionKeyMetadata, key)
		m.Metadata.Set(versionMetadata, strconv.FormatInt(version, 10))
		m.Metadata.Set(indexMetadata, strconv.Itoa(i+1))
		m.SetContext(txCtx)
		msgs[i] = m
	}
	return msgs
}

// printProgress prints the counters and the sequencer's total every second
// until the returned function is called, which prints a last line.
func (d *demo) printProgress(c *counters) (stop func()) {
	start := time.Now()
	line := func() {
		fmt.Fprintf(d.out, "   %5.1fs  committed %6d msgs (%5d tx)  rolled back %5d msgs (%4d tx)  sequenced %6d\n",
			time.Since(start).Seconds(), c.committedMsgs.Load(), c.committedTx.Load(),
			c.rolledBackMsgs.Load(), c.rolledBackTx.Load(), d.sequencer.Stats().Sequenced)
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				line()
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		line()
	}
}
