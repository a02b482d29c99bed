package main

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// consumer reads a Kafka topic from its start with a franz-go client (no
// consumer group: every partition, directly) and records when each message
// first arrived, by its bench_n header. With trim, it deletes what it has
// consumed from the broker about once a second (DeleteRecords), so that the
// in-process broker's memory stays flat however long the run.
type consumer struct {
	client  *kgo.Client
	topic   string
	t0      time.Time
	commits []atomic.Int64 // commit times by bench_n (written by the publishers)
	recv    []atomic.Int64 // first receive times by bench_n, ns since t0; 0: not yet
	trim    bool

	received   atomic.Int64 // distinct messages received
	duplicates atomic.Int64 // copies of messages already received
	foreign    atomic.Int64 // records without a usable bench_n header
	trimErrors atomic.Int64 // failed DeleteRecords requests or partitions
	lastRecv   atomic.Int64 // ns since t0 of the latest first arrival

	mu     sync.Mutex
	window []int64 // latencies (ns) of the messages first received since the last takeWindow

	cancel context.CancelFunc
	done   chan struct{}
}

// startConsumer starts a consumer of topic on brokers for messages 0 …
// len(commits)-1, whose commit times the publishers store in commits. The
// client is told to wait at most 50 ms for data; kfake answers a waiting
// fetch as soon as a record is produced, so the wait adds no latency.
func startConsumer(brokers []string, topic string, t0 time.Time, commits []atomic.Int64, trim bool) (*consumer, error) {
	client, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50*time.Millisecond),
		// A record counts as arrived when a consumer of an exactly-once
		// forwarder may see it: once its transaction committed.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	recv := make([]atomic.Int64, len(commits))
	prefault(recv)
	c := &consumer{
		client: client, topic: topic, t0: t0, commits: commits, recv: recv, trim: trim,
		cancel: cancel, done: make(chan struct{}),
	}
	go c.run(ctx)
	return c, nil
}

// Close stops the consumer.
func (c *consumer) Close() {
	c.cancel()
	<-c.done
	c.client.Close()
}

func (c *consumer) run(ctx context.Context) {
	defer close(c.done)
	next := map[int32]int64{} // per partition: the offset after the last record consumed
	lastTrim := time.Now()
	var lats []int64
	for {
		fetches := c.client.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return
		}
		now := max(1, time.Since(c.t0).Nanoseconds())
		lats = lats[:0]
		fetches.EachRecord(func(r *kgo.Record) {
			next[r.Partition] = r.Offset + 1
			n := benchIndex(r)
			if n < 0 || n >= len(c.recv) {
				c.foreign.Add(1)
				return
			}
			if !c.recv[n].CompareAndSwap(0, now) {
				c.duplicates.Add(1)
				return
			}
			c.received.Add(1)
			// A record can arrive before its publisher has stored the
			// commit time: count that as no latency.
			lat := int64(0)
			if at := c.commits[n].Load(); at > 0 {
				lat = max(0, now-at)
			}
			lats = append(lats, lat)
		})
		if len(lats) > 0 {
			c.lastRecv.Store(now)
			c.mu.Lock()
			c.window = append(c.window, lats...)
			c.mu.Unlock()
		}
		if c.trim && len(next) > 0 && time.Since(lastTrim) >= time.Second {
			lastTrim = time.Now()
			c.deleteConsumed(ctx, next)
		}
	}
}

// prefault writes to every page of s, so that the whole slice is resident
// from the start: otherwise the pages become resident as the run reaches
// them, and this process's RSS would grow with the messages for no other
// reason.
func prefault(s []atomic.Int64) {
	for i := 0; i < len(s); i += 512 {
		s[i].Store(0)
	}
}

// benchIndex returns a record's bench_n header, or -1.
func benchIndex(r *kgo.Record) int {
	for _, h := range r.Headers {
		if h.Key == benchN {
			n, err := strconv.Atoi(string(h.Value))
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// deleteConsumed deletes the records before next[p] from each partition p
// (a DeleteRecords request).
func (c *consumer) deleteConsumed(ctx context.Context, next map[int32]int64) {
	req := kmsg.NewPtrDeleteRecordsRequest()
	req.TimeoutMillis = 5000
	t := kmsg.NewDeleteRecordsRequestTopic()
	t.Topic = c.topic
	for p, off := range next {
		rp := kmsg.NewDeleteRecordsRequestTopicPartition()
		rp.Partition, rp.Offset = p, off
		t.Partitions = append(t.Partitions, rp)
	}
	req.Topics = append(req.Topics, t)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, c.client)
	if err != nil {
		c.trimErrors.Add(1)
		return
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if rp.ErrorCode != 0 {
				c.trimErrors.Add(1)
			}
		}
	}
}

// takeWindow returns the latencies (ns) of the messages first received
// since the last call, in arrival order.
func (c *consumer) takeWindow() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.window
	c.window = nil
	return w
}

// latencies returns, sorted, the commit→receive latencies (ns) of the
// messages that have both times; one received before its commit returned
// counts as 0.
func (c *consumer) latencies() []int64 {
	out := make([]int64, 0, c.received.Load())
	for i := range c.recv {
		r, cm := c.recv[i].Load(), c.commits[i].Load()
		if r > 0 && cm > 0 {
			out = append(out, max(0, r-cm))
		}
	}
	sortInt64s(out)
	return out
}

// watch polls every 100 ms, calling tick each time, until the consumer has
// want distinct messages, or until -max-drain after publishing ended
// (pubDone delivers the publishers' result). It returns when it stopped
// and whether every message arrived, or the publishers' error.
func (b *bench) watch(ctx context.Context, c *consumer, want int64, pubDone <-chan error, tick func(now time.Time)) (end time.Time, complete bool, err error) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var deadline time.Time
	for {
		select {
		case err := <-pubDone:
			if err != nil {
				return time.Now(), false, err
			}
			pubDone = nil
			deadline = time.Now().Add(b.cfg.maxDrain)
		case <-t.C:
		case <-ctx.Done():
			return time.Now(), false, ctx.Err()
		}
		now := time.Now()
		if tick != nil {
			tick(now)
		}
		// Done once the publishers are, too (a record can reach the
		// consumer just before its COMMIT returns to the publisher).
		if c.received.Load() >= want && pubDone == nil {
			return now, true, nil
		}
		if !deadline.IsZero() && now.After(deadline) {
			return now, false, nil
		}
	}
}
