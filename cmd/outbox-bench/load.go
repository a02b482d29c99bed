package main

import (
	"context"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
)

// benchN is the metadata key that carries a message's index in its run
// (decimal). Both relays pass metadata on as Kafka record headers, where the
// latency consumer finds it.
const benchN = "bench_n"

// txJob is one transaction for a publisher: its index (its messages are
// index*perTx … index*perTx+perTx-1) and, for a paced load, when it is due
// (since the load's t0).
type txJob struct {
	index int
	due   time.Duration
}

// load is a publishing workload: the system, the connections, the messages
// per transaction, and what to record.
type load struct {
	sys     *system
	pool    *pgxpool.Pool
	perTx   int
	workers int
	// t0 is the origin of the commit times, due times and lags.
	t0 time.Time
	// tag puts metadata bench_n on each message.
	tag bool
	// commits, when not nil, gets each message's commit time (ns since t0,
	// at least 1) by index, stored right after COMMIT returns.
	commits []atomic.Int64
	// lags, when not nil, gets each transaction's lag (ns) behind its due
	// time when a publisher took it up, by index.
	lags []int64

	published  atomic.Int64 // messages committed so far
	lastCommit atomic.Int64 // ns since t0 of the latest COMMIT
}

// publish runs l.workers publishers that take transactions from jobs until
// it is closed or ctx ends. The first error stops the others and is
// returned.
func (b *bench) publish(ctx context.Context, l *load, jobs <-chan txJob) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for w := range l.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.publisher(ctx, l, jobs, uint64(w)); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	return context.Cause(ctx)
}

// publisher is one publishing goroutine of publish: each transaction holds
// l.perTx messages of b.payload with a random key of b.keys.
func (b *bench) publisher(ctx context.Context, l *load, jobs <-chan txJob, seed uint64) error {
	rng := mrand.New(mrand.NewPCG(seed+1, uint64(l.perTx)))
	for {
		var job txJob
		select {
		case <-ctx.Done():
			return nil
		case j, ok := <-jobs:
			if !ok {
				return nil
			}
			job = j
		}
		if l.lags != nil {
			l.lags[job.index] = int64(time.Since(l.t0) - job.due)
		}
		first := job.index * l.perTx
		msgs := make([]*message.Message, l.perTx)
		for i := range msgs {
			m := message.NewMessage(watermill.NewUUID(), b.payload)
			m.Metadata.Set(outbox.PublishPartitionKeyMetadata, b.keys[rng.IntN(len(b.keys))])
			if l.tag {
				m.Metadata.Set(benchN, strconv.Itoa(first+i))
			}
			msgs[i] = m
		}
		if err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error { return l.sys.publish(ctx, tx, msgs) }); err != nil {
			return err
		}
		at := max(1, time.Since(l.t0).Nanoseconds())
		if l.commits != nil {
			for i := range msgs {
				l.commits[first+i].Store(at)
			}
		}
		l.published.Add(int64(l.perTx))
		for {
			last := l.lastCommit.Load()
			if at <= last || l.lastCommit.CompareAndSwap(last, at) {
				break
			}
		}
	}
}

// unpaced hands out transactions 0..txs-1 as fast as the publishers take
// them. hold, when not nil, is called before each one and may block (to
// bound a backlog); it returns false to stop handing out.
func unpaced(ctx context.Context, txs int, hold func(ctx context.Context) bool) <-chan txJob {
	ch := make(chan txJob)
	go func() {
		defer close(ch)
		for i := range txs {
			if hold != nil && !hold(ctx) {
				return
			}
			select {
			case ch <- txJob{index: i}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// paced hands out transactions 0..txs-1, transaction i at start +
// i/perSecond: an open-loop schedule. The channel holds up to 65,536
// transactions, so the pacer does not wait for publishers that fall
// behind; a transaction they take up late keeps its due time (measured
// from t0), and the lag shows in load.lags.
func paced(ctx context.Context, t0, start time.Time, txs int, perSecond float64) <-chan txJob {
	ch := make(chan txJob, min(txs, 1<<16))
	go func() {
		defer close(ch)
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		offset := start.Sub(t0)
		for i := range txs {
			due := offset + time.Duration(float64(i)*float64(time.Second)/perSecond)
			if d := due - time.Since(t0); d > 0 {
				timer.Reset(d)
				select {
				case <-timer.C:
				case <-ctx.Done():
					return
				}
			}
			ch <- txJob{index: i, due: due}
		}
	}()
	return ch
}
