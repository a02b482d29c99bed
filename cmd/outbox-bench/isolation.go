package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
)

// The isolation phase measures key-level isolation (outbox.KeyIsolation)
// on the Subscriber: one paced publisher, 1% of the keys failing for a
// window in the middle of the run, and three runs in a row — no failures,
// failures with isolation off, failures with isolation on. It reports, for
// the other keys of the partitions that hold a failing key, how many were
// handled per second during the window and their commit→handled latency.

// Isolation runs.
const (
	isoNoFailures = "no failures"
	isoOff        = "failures, isolation off"
	isoOn         = "failures, isolation on"
)

// isolationResult is one run of the isolation phase.
type isolationResult struct {
	Run         string  `json:"run"`
	Partitions  int     `json:"partitions"`
	Keys        int     `json:"keys"`
	FailingKeys int     `json:"failing_keys"`
	OfferedRate int     `json:"offered_msgs_per_s"`
	Seconds     float64 `json:"duration_s"`
	// WindowStart and WindowSeconds: when (from the first due
	// transaction) the failing keys fail, and for how long.
	WindowStart   float64 `json:"window_start_s"`
	WindowSeconds float64 `json:"window_s"`
	Messages      int     `json:"messages"`
	// Others*: the other keys of the partitions holding a failing key.
	// OthersInWindow of them were handled during the window, at
	// OthersWindowRate per second; OthersCommitted were committed then.
	OthersCommitted  int          `json:"others_committed_in_window"`
	OthersInWindow   int          `json:"others_handled_in_window"`
	OthersWindowRate float64      `json:"others_window_msgs_per_s"`
	OthersLatency    latencyStats `json:"others_latency"`
	// FailingLatency: of the failing keys' messages, commit→handled.
	FailingLatency latencyStats `json:"failing_latency"`
	// OrderKept: every key's messages were handled in publish order, each
	// once; DrainSeconds: from the last commit until everything was
	// handled.
	OrderKept    bool    `json:"order_kept"`
	DrainSeconds float64 `json:"drain_s"`
	Complete     bool    `json:"complete"`
}

// isolationPhase runs the three isolation runs.
func (b *bench) isolationPhase(ctx context.Context, res *results) error {
	for _, run := range []string{isoNoFailures, isoOff, isoOn} {
		r, err := b.runIsolation(ctx, run)
		if err != nil {
			return fmt.Errorf("%s: %w", run, err)
		}
		res.Isolation = append(res.Isolation, r)
	}
	return nil
}

// isolationSizes are the run's duration, failure window and offered load.
func (b *bench) isolationSizes() (total, start, window time.Duration, rate int) {
	if b.cfg.smoke {
		return 3 * time.Second, time.Second, time.Second, 1000
	}
	return 20 * time.Second, 5 * time.Second, 10 * time.Second, b.cfg.isolationRate
}

func (b *bench) runIsolation(ctx context.Context, run string) (*isolationResult, error) {
	total, winStart, window, rate := b.isolationSizes()
	partitions := min(b.cfg.partitions, 4)
	schema := "iso_" + strings.NewReplacer(" ", "_", ",", "").Replace(run)
	const topic = "iso"
	if err := b.createSchema(ctx, schema); err != nil {
		return nil, err
	}
	pool, err := b.warmPool(ctx, 16)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		return nil, err
	}
	if err := outbox.RegisterTopic(ctx, pool, schema, topic, partitions); err != nil {
		return nil, err
	}
	const perTx = 10
	txs := int(float64(rate) / perTx * total.Seconds())
	r := &isolationResult{Run: run, Partitions: partitions, Keys: len(b.keys), FailingKeys: max(1, len(b.keys)/100),
		OfferedRate: rate, Seconds: total.Seconds(), WindowStart: winStart.Seconds(), WindowSeconds: window.Seconds(), Messages: txs * perTx}
	failing := map[string]bool{}
	for i := 0; len(failing) < r.FailingKeys; i += 100 {
		failing[b.keys[i%len(b.keys)]] = true
	}
	keyOf := func(n int) string { return b.keys[(n*7919)%len(b.keys)] }

	commits := make([]atomic.Int64, r.Messages) // ns since t0
	handled := make([]atomic.Int64, r.Messages)
	parts := make([]atomic.Int32, r.Messages)
	var (
		orderMu  sync.Mutex
		lastSeq  = map[string]int64{}
		outOfOrd atomic.Bool
		count    atomic.Int64
		allDone  = make(chan struct{})
	)
	tu := adaptive.Default()
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
		Schema: schema, Pool: pool, ConsumerGroup: "bench", Tuning: tu,
		KeyIsolation: outbox.KeyIsolation{Enabled: run == isoOn},
	}, nil)
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	var t0 time.Time
	inWindow := func(now time.Time) bool {
		d := now.Sub(t0)
		return run != isoNoFailures && d >= winStart && d < winStart+window
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(runCtx, topic)
	if err != nil {
		return nil, err
	}
	t0 = time.Now().Add(latencyWarmup)
	go func() {
		for m := range msgs {
			key := m.Metadata.Get(outbox.MetadataPartitionKey)
			now := time.Now()
			if failing[key] && inWindow(now) {
				m.Nack()
				continue
			}
			n, _ := strconv.Atoi(m.Metadata.Get("bench_n"))
			p, _ := strconv.Atoi(m.Metadata.Get(outbox.MetadataPartition))
			seq, _ := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSeq), 10, 64)
			if handled[n].CompareAndSwap(0, int64(now.Sub(t0))+1) {
				parts[n].Store(int32(p))
				orderMu.Lock()
				if lastSeq[key] > seq { // (a key's seqs grow in commit order)
					outOfOrd.Store(true)
				}
				lastSeq[key] = seq
				orderMu.Unlock()
				if count.Add(1) == int64(r.Messages) {
					close(allDone)
				}
			} else {
				outOfOrd.Store(true) // handled twice: not expected without crashes
			}
			m.Ack()
		}
	}()

	logf("isolation, %s: %d messages over %d keys (%d failing from %v for %v) into %d partitions at %d msg/s",
		run, r.Messages, r.Keys, r.FailingKeys, winStart, window, partitions, rate)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: pool, OwnTransaction: true}, nil)
	if err != nil {
		return nil, err
	}
	const publishers = 4
	var wg sync.WaitGroup
	pubErr := make(chan error, publishers)
	interval := time.Duration(float64(time.Second) * perTx / float64(rate))
	for w := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tx := w; tx < txs; tx += publishers {
				due := t0.Add(time.Duration(tx) * interval)
				time.Sleep(time.Until(due))
				batch := make([]*message.Message, perTx)
				for i := range batch {
					n := tx*perTx + i
					m := message.NewMessage(strconv.Itoa(n), b.payload)
					m.Metadata.Set(outbox.PublishPartitionKeyMetadata, keyOf(n))
					m.Metadata.Set("bench_n", strconv.Itoa(n))
					batch[i] = m
				}
				if err := pub.Publish(topic, batch...); err != nil {
					pubErr <- err
					return
				}
				at := int64(time.Since(t0))
				for i := range batch {
					commits[tx*perTx+i].Store(at)
				}
			}
		}()
	}
	wg.Wait()
	close(pubErr)
	if err := <-pubErr; err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	lastCommit := time.Now()
	select {
	case <-allDone:
		r.Complete = true
	case <-time.After(b.cfg.maxDrain):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.DrainSeconds = time.Since(lastCommit).Seconds()
	cancel()

	// The partitions holding a failing key, and the other keys' figures
	// there.
	failingParts := map[int32]bool{}
	for n := range r.Messages {
		if failing[keyOf(n)] && handled[n].Load() != 0 {
			failingParts[parts[n].Load()] = true
		}
	}
	ws, we := int64(winStart), int64(winStart+window)
	var others, failed []int64
	for n := range r.Messages {
		h := handled[n].Load()
		if h == 0 {
			continue
		}
		h--
		lat := max(h-commits[n].Load(), 0)
		if failing[keyOf(n)] {
			failed = append(failed, lat)
			continue
		}
		if !failingParts[parts[n].Load()] {
			continue
		}
		others = append(others, lat)
		if c := commits[n].Load(); c >= ws && c < we {
			r.OthersCommitted++
		}
		if h >= ws && h < we {
			r.OthersInWindow++
		}
	}
	slices.Sort(others)
	slices.Sort(failed)
	r.OthersLatency, r.FailingLatency = summarize(others), summarize(failed)
	r.OthersWindowRate = float64(r.OthersInWindow) / window.Seconds()
	r.OrderKept = !outOfOrd.Load() && r.Complete
	logf("isolation, %s: others in the failing partitions %.0f msg/s during the window (%d of %d committed then), p99 %.1f ms; drain %.1f s; order kept %v",
		run, r.OthersWindowRate, r.OthersInWindow, r.OthersCommitted, r.OthersLatency.P99Ms, r.DrainSeconds, r.OrderKept)
	return r, nil
}

// isolationMarkdown renders the isolation runs and their ratios.
func (res *results) isolationMarkdown(sb *strings.Builder) {
	if len(res.Isolation) == 0 {
		return
	}
	first := res.Isolation[0]
	fmt.Fprintf(sb, "## Key isolation\n\n%d messages at %d msg/s over %d keys in %d partitions; %d keys (1%%) fail from %.0f s for %.0f s. "+
		"\"Others\": the other keys of the partitions holding a failing key; the Subscriber with adaptive.Default(), handlers that do nothing else.\n\n",
		first.Messages, first.OfferedRate, first.Keys, first.Partitions, first.FailingKeys, first.WindowStart, first.WindowSeconds)
	sb.WriteString("| run | others handled in the window, msg/s | others committed in the window | others p50 ms | others p99 ms | failing keys p99 ms | drain s | order kept |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range res.Isolation {
		fmt.Fprintf(sb, "| %s | %.0f | %d | %.1f | %.1f | %.0f | %.1f | %s |\n", r.Run, r.OthersWindowRate, r.OthersCommitted,
			r.OthersLatency.P50Ms, r.OthersLatency.P99Ms, r.FailingLatency.P99Ms, r.DrainSeconds, yesNo(r.OrderKept))
	}
	base, off, on := res.isolationRun(isoNoFailures), res.isolationRun(isoOff), res.isolationRun(isoOn)
	if base != nil && off != nil && on != nil && base.OthersWindowRate > 0 {
		fmt.Fprintf(sb, "\nOthers' throughput in the window, relative to no failures: isolation on %.2f×, off %.2f×.\n\n",
			on.OthersWindowRate/base.OthersWindowRate, off.OthersWindowRate/base.OthersWindowRate)
	}
}

func (res *results) isolationRun(name string) *isolationResult {
	for _, r := range res.Isolation {
		if r.Run == name {
			return r
		}
	}
	return nil
}
