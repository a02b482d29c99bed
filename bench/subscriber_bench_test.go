package bench

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"regexp"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/procstat"
)

// The subscriber benchmarks (docs/subscriber-benchmarks.md):
//
//   - BenchmarkCommitToHandlerLatency: a paced publisher offers a steady load
//     (one message per transaction) and a Subscriber, running its own
//     Sequencer, hands every message to a consumer that acks at once. The
//     latency of a message is the time from its Commit returning to the
//     consumer receiving it: commit → NOTIFY → sequencer pass → NOTIFY →
//     partition worker → channel. b.N is ignored: every run lasts
//     -sub.duration (after -sub.warmup, which is not counted).
//   - BenchmarkDrain16Partitions: a backlog published and sequenced before
//     the timer starts, then delivered by a Subscriber (high-throughput
//     profile) through Subscribe (ack at once) or ConsumeBatches. b.N is
//     ignored: the backlog is -sub.backlog messages.
//
// Both suppress ns/op (it would be the length of the whole run) and report
// their own figures.
var (
	subDuration = flag.Duration("sub.duration", 10*time.Second, "measured length of each BenchmarkCommitToHandlerLatency run")
	subWarmup   = flag.Duration("sub.warmup", 2*time.Second, "paced publishing before the measured part of each latency run (not counted)")
	subRate     = flag.Int("sub.rate", 1000, "offered load of BenchmarkCommitToHandlerLatency in messages (= transactions) per second")
	subBacklog  = flag.Int("sub.backlog", 100_000, "backlog of BenchmarkDrain16Partitions in messages")
	subProfile  = flag.String("sub.cpuprofile", "", "write a CPU profile of each timed drain phase (only) to <prefix>-<variant>.pprof")
	subSample   = flag.Bool("sub.sample", false, "sample pg_stat_activity every 2ms during the timed drain phases and print what the server was doing (adds load; not for the official figures)")
	subPubConns = flag.Int("sub.publishers", 16, "publisher connections of BenchmarkCommitToHandlerLatency (each runs one transaction at a time)")

	// Diagnostics: they change what is measured, to find out what limits it.
	subNoPacing  = flag.Bool("sub.nopacing", false, "diagnostic: drain with the pacing waits at 1ns (Advanced.PollInterval, which bounds the busy pace too)")
	subAsync     = flag.Bool("sub.async", false, "diagnostic: run the subscriber's connections with synchronous_commit=off")
	subConsumers = flag.Int("sub.consumers", 1, "diagnostic: goroutines reading the Subscribe channel in the drain")
)

const (
	subGroup     = "bench"
	subPoolConns = 32 // the subscriber's own pool: 16 workers, the sequencer, the lease manager, the listeners
)

// newSubPool makes the connection pool a Subscriber runs on. pgxpool's
// default (max(4, GOMAXPROCS) connections, 4 on this machine) would make 16
// partition workers queue for connections.
func newSubPool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = subPoolConns
	if *subAsync {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// waitLeases waits until the group holds a live lease on every partition.
func waitLeases(ctx context.Context, e *env, schema string, timeout time.Duration) error {
	q := sqlFor(schema, `SELECT count(*) FROM {{s}}.cursors WHERE group_name = '`+subGroup+`'
		AND lease_owner IS NOT NULL AND lease_expires_at > now()`)
	deadline := time.Now().Add(timeout)
	for {
		n, err := e.count(ctx, q)
		if err != nil {
			return err
		}
		if n == partitionCount {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d leases held after %v", n, partitionCount, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// percentile returns the nearest-rank q-quantile of sorted ds.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// sched is the CPU time used by the server and this process, and the time
// their threads spent runnable but waiting for a CPU (Linux schedstat): on
// a machine shared with other work, the second says how much the figures
// were held back by the neighbours.
type sched struct {
	cpu, clientCPU, runq time.Duration
	ok                   bool
}

func (e *env) sched() sched {
	server, client, ok := procstat.CPU(e.postmaster)
	s := sched{cpu: server + client, clientCPU: client, ok: ok}
	if !ok {
		return s
	}
	delay, ok1 := schedDelay("/proc/self/task", nil)
	sdelay, ok2 := schedDelay("/proc", func(pid string) bool { return pid == strconv.Itoa(e.postmaster) || ppidOf(pid) == e.postmaster })
	s.runq, s.ok = delay+sdelay, ok1 && ok2
	return s
}

func (s sched) since(before sched) sched {
	return sched{cpu: s.cpu - before.cpu, clientCPU: s.clientCPU - before.clientCPU, runq: s.runq - before.runq, ok: s.ok && before.ok}
}

// schedDelay sums the run-queue delay (second field of schedstat) of the
// tasks under dir that keep passes (all when nil).
func schedDelay(dir string, keep func(pid string) bool) (time.Duration, bool) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	var sum time.Duration
	found := false
	for _, d := range entries {
		if d.Name()[0] < '0' || d.Name()[0] > '9' || (keep != nil && !keep(d.Name())) {
			continue
		}
		b, err := os.ReadFile(dir + "/" + d.Name() + "/schedstat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			sum += time.Duration(v)
			found = true
		}
	}
	return sum, found
}

func ppidOf(pid string) int {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return -1
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		return -1
	}
	return n
}

// addSched puts CPU cores used and run-queue wait per CPU second into m.
func addSched(m map[string]float64, s sched, wall time.Duration) {
	if !s.ok || wall <= 0 || s.cpu <= 0 {
		return
	}
	m["cpu-cores"] = s.cpu.Seconds() / wall.Seconds()
	m["client-cpu-share"] = s.clientCPU.Seconds() / s.cpu.Seconds()
	m["runq/cpu"] = s.runq.Seconds() / s.cpu.Seconds()
}

// ---------------------------------------------------------------------------
// Commit-to-handler latency

type latencyConfig struct {
	tuning   adaptive.Tuning
	rate     int           // messages (transactions) per second
	warmup   time.Duration // paced publishing before the measured part
	duration time.Duration // measured part
}

// stamp follows one message. Times are offsets from the run's base time
// (monotonic clock); 0 means "not yet".
type stamp struct {
	uuid     string
	due      time.Duration // when the pacer scheduled it
	commitAt time.Time     // wall clock right after Commit returned (for the server's sequenced_at)
	commit   atomic.Int64  // right after Commit returned
	recv     atomic.Int64  // when the consumer got it (first delivery)
	dups     atomic.Int32  // further deliveries
}

type latencyResult struct {
	published, measured int
	lat                 []time.Duration // measured messages, sorted
	early               int             // received before Commit returned in the publisher (latency counted as 0)
	dups                int             // redeliveries
	pubLag              []time.Duration // commit - due, sorted: how late the paced publisher was
	rate                float64         // achieved commit rate over the measured part
	toSeq, fromSeq      []time.Duration // commit → sequencer tx start, sequencer tx start → handler (sorted; wall clocks of one host)
	sched               sched           // over the whole paced run, warm-up included
	wall                time.Duration
}

// runLatency runs one commit-to-handler latency measurement in a fresh
// schema and checks that every message arrived exactly once.
func runLatency(ctx context.Context, e *env, t timer, cfg latencyConfig) (res latencyResult, err error) {
	schema, err := e.newSchema(ctx, "lat")
	if err != nil {
		return res, err
	}
	defer func() { _ = e.dropSchema(context.WithoutCancel(ctx), schema) }()
	// Autovacuum stays on here (unlike the drain's setupOutbox): pending
	// sees a steady insert/delete churn, as in a running service.
	if err := outbox.Migrate(ctx, e.pool, schema); err != nil {
		return res, err
	}
	if err := outbox.RegisterTopic(ctx, e.pool, schema, topic, partitionCount); err != nil {
		return res, err
	}
	if err := e.maybeCheckpoint(ctx); err != nil {
		return res, err
	}
	pool, err := newSubPool(ctx)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	subCfg := outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: subGroup, Tuning: cfg.tuning}
	if *subAsync {
		// The diagnostic makes only the subscriber's own writes (cursor,
		// adaptive state, leases) asynchronous: the sequencer, whose
		// commits must be durable before anyone reads them, runs apart on
		// a synchronous pool.
		subCfg.DisableSequencer = true
		seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: e.pool}, nil)
		if err != nil {
			return res, err
		}
		seqCtx, stopSeq := context.WithCancel(ctx)
		seqDone := make(chan struct{})
		go func() { defer close(seqDone); _ = seq.Run(seqCtx) }()
		defer func() { stopSeq(); <-seqDone }()
	}
	sub, err := outbox.NewSubscriber(subCfg, nil)
	if err != nil {
		return res, err
	}
	defer sub.Close()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema}, nil) // NOTIFY on: it wakes the sequencer
	if err != nil {
		return res, err
	}
	// Enough publisher connections that a slow commit (an fsync, a busy
	// CPU) does not hold back the next ones: the offered load stays steady.
	var pubConns []*pgx.Conn
	defer func() {
		for _, c := range pubConns {
			_ = c.Close(context.Background())
		}
	}()
	for range *subPubConns {
		c, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return res, err
		}
		pubConns = append(pubConns, c)
	}

	interval := time.Second / time.Duration(cfg.rate)
	warmN := int(cfg.warmup / interval)
	total := warmN + int(cfg.duration/interval)
	stamps := make([]*stamp, total)
	var byUUID sync.Map // uuid -> *stamp, for the consumer
	base := time.Now()
	since := func() int64 { return int64(time.Since(base)) }

	subCtx, stopSub := context.WithCancel(ctx)
	defer stopSub()
	ch, err := sub.Subscribe(subCtx, topic)
	if err != nil {
		return res, err
	}
	var received, unknown atomic.Int64
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for msg := range ch {
			now := since()
			if v, ok := byUUID.Load(msg.UUID); ok {
				st := v.(*stamp)
				if st.recv.CompareAndSwap(0, now) {
					received.Add(1)
				} else {
					st.dups.Add(1)
				}
			} else {
				unknown.Add(1)
			}
			msg.Ack()
		}
	}()
	if err := waitLeases(ctx, e, schema, 30*time.Second); err != nil {
		return res, err
	}

	// The pacer schedules message i at base+i·interval (open loop: a slow
	// commit does not delay the next ones); the publishers, one connection
	// each, take them in order.
	t.StartTimer()
	pacerStart := time.Duration(since())
	jobs := make(chan int, total)
	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	go func() {
		defer close(jobs)
		for i := range total {
			if d := pacerStart + time.Duration(i)*interval - time.Since(base); d > 0 {
				select {
				case <-time.After(d):
				case <-pubCtx.Done():
					return
				}
			}
			jobs <- i
		}
	}()
	var pubWG sync.WaitGroup
	var pubErr error
	var pubErrOnce sync.Once
	before := e.sched()
	for w, conn := range pubConns {
		pubWG.Add(1)
		go func() {
			defer pubWG.Done()
			g := newGen(100+w, payloadSize)
			for i := range jobs {
				m := g.messages(1)[0]
				st := &stamp{uuid: m.UUID, due: pacerStart + time.Duration(i)*interval}
				stamps[i] = st
				byUUID.Store(m.UUID, st)
				err := pgx.BeginFunc(pubCtx, conn, func(tx pgx.Tx) error {
					m.SetContext(outbox.WithTx(pubCtx, tx))
					return pub.Publish(topic, m)
				})
				st.commit.Store(since())
				st.commitAt = time.Now()
				if err != nil {
					pubErrOnce.Do(func() { pubErr = err; stopPub() })
					return
				}
			}
		}()
	}
	pubWG.Wait()
	if pubErr != nil {
		return res, fmt.Errorf("publish: %w", pubErr)
	}
	res.published = total
	deadline := time.Now().Add(60 * time.Second)
	for received.Load() < int64(total) && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	t.StopTimer()
	res.sched = e.sched().since(before)
	res.wall = time.Duration(since()) - pacerStart
	time.Sleep(50 * time.Millisecond) // let a redelivery, if any, show up
	stopSub()
	_ = sub.Close()
	<-consumed
	if got := received.Load(); got != int64(total) {
		return res, fmt.Errorf("received %d of %d messages", got, total)
	}
	if u := unknown.Load(); u != 0 {
		return res, fmt.Errorf("received %d messages that were not published", u)
	}

	// The server's sequenced_at (now() of the sequencer's transaction)
	// splits each latency in two: up to the sequencer pass, and after it.
	seqAt := map[string]time.Time{}
	rows, err := e.admin.Query(ctx, sqlFor(schema, "SELECT uuid, sequenced_at FROM {{s}}.log"))
	if err != nil {
		return res, err
	}
	for rows.Next() {
		var u string
		var at time.Time
		if err := rows.Scan(&u, &at); err != nil {
			rows.Close()
			return res, err
		}
		seqAt[u] = at
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return res, err
	}

	var first, last int64 = math.MaxInt64, 0
	for i, st := range stamps {
		res.dups += int(st.dups.Load())
		if i < warmN {
			continue
		}
		res.measured++
		c, r := st.commit.Load(), st.recv.Load()
		first, last = min(first, c), max(last, c)
		l := time.Duration(r - c)
		if l < 0 {
			res.early++
			l = 0
		}
		res.lat = append(res.lat, l)
		res.pubLag = append(res.pubLag, time.Duration(c)-st.due)
		if at, ok := seqAt[st.uuid]; ok {
			toSeq := at.Sub(st.commitAt)
			res.toSeq = append(res.toSeq, toSeq)
			res.fromSeq = append(res.fromSeq, l-toSeq)
		}
	}
	if last > first {
		res.rate = float64(res.measured-1) / time.Duration(last-first).Seconds()
	}
	for _, s := range [][]time.Duration{res.lat, res.pubLag, res.toSeq, res.fromSeq} {
		slices.Sort(s)
	}
	return res, nil
}

var latencyProfiles = []struct {
	name   string
	tuning func() adaptive.Tuning
}{
	{"low-latency", adaptive.LowLatency},
	{"default", adaptive.Default},
}

// BenchmarkCommitToHandlerLatency measures commit-to-handler latency under
// a steady offered load (-sub.rate messages per second, one per
// transaction, 1,000 keys over 16 partitions, 256-byte payloads) for
// -sub.duration, with the low-latency and the default profile side by side.
// b.N is ignored.
func BenchmarkCommitToHandlerLatency(b *testing.B) {
	e := newEnv(b, true)
	var subs []string
	for r := range *rounds {
		for _, p := range latencyProfiles {
			b.Run(p.name, func(b *testing.B) { benchLatency(b, e, p.tuning()) })
			if r == 0 {
				subs = append(subs, p.name)
			}
		}
	}
	metrics := []string{"p50-ms", "p99-ms", "p99.9-ms", "max-ms", "msgs/s", "cpu-us/msg", "runq/cpu"}
	printMedians(b.Name(), subs, metrics)
	var parts []string
	for _, m := range metrics[:4] {
		d, okD := lookup(b.Name()+"/default", m)
		l, okL := lookup(b.Name()+"/low-latency", m)
		parts = append(parts, fmt.Sprintf("%s %s", m, ratio(d, l, okD, okL)))
	}
	fmt.Printf("%s: ratio of medians default/low-latency: %s\n", b.Name(), strings.Join(parts, ", "))
}

func benchLatency(b *testing.B, e *env, tuning adaptive.Tuning) {
	b.StopTimer()
	b.ResetTimer()
	res, err := runLatency(context.Background(), e, b, latencyConfig{
		tuning: tuning, rate: *subRate, warmup: *subWarmup, duration: *subDuration,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(0, "ns/op")
	m := map[string]float64{
		"p50-ms":          ms(percentile(res.lat, 0.50)),
		"p99-ms":          ms(percentile(res.lat, 0.99)),
		"p99.9-ms":        ms(percentile(res.lat, 0.999)),
		"max-ms":          ms(res.lat[len(res.lat)-1]),
		"msgs/s":          res.rate,
		"pub-lag-p99-ms":  ms(percentile(res.pubLag, 0.99)),
		"to-seq-p50-ms":   ms(percentile(res.toSeq, 0.50)),
		"to-seq-p99-ms":   ms(percentile(res.toSeq, 0.99)),
		"from-seq-p50-ms": ms(percentile(res.fromSeq, 0.50)),
		"from-seq-p99-ms": ms(percentile(res.fromSeq, 0.99)),
	}
	addSched(m, res.sched, res.wall)
	if res.sched.ok {
		m["cpu-us/msg"] = float64(res.sched.cpu.Microseconds()) / float64(res.published)
	}
	report(b, m)
	fmt.Printf("%s: %d msgs measured (%d warm-up before), %.0f msgs/s committed: latency p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.2f ms; "+
		"commit→sequencer p50/p99 %.2f/%.2f ms, sequencer→handler p50/p99 %.2f/%.2f ms; publisher lag p99 %.2f ms; %d early, %d redelivered; "+
		"%.1f µs CPU/msg (server+client, %.0f%% client), %.2f cores, run-queue wait %.2f s per CPU s\n",
		b.Name(), res.measured, res.published-res.measured, res.rate, m["p50-ms"], m["p99-ms"], m["p99.9-ms"], m["max-ms"],
		m["to-seq-p50-ms"], m["to-seq-p99-ms"], m["from-seq-p50-ms"], m["from-seq-p99-ms"], m["pub-lag-p99-ms"], res.early, res.dups,
		m["cpu-us/msg"], 100*m["client-cpu-share"], m["cpu-cores"], m["runq/cpu"])
}

// ---------------------------------------------------------------------------
// Draining a backlog

type drainMode string

const (
	drainSubscribe drainMode = "subscribe"
	drainBatches   drainMode = "batches"
)

type drainResult struct {
	phase
	sched    sched
	first    time.Duration // from the start to the first delivery (leases, first read)
	steady   float64       // msgs/s from the first delivery to the last
	deliver  time.Duration // from the start to the last delivery
	samples  map[string]int
	nSamples int
}

// partitionOrder checks that each partition's messages arrive exactly once
// and in seq order: 1, 2, 3, …
type partitionOrder struct {
	last [partitionCount]atomic.Int64
	err  atomic.Pointer[error]
}

func (o *partitionOrder) see(msg *message.Message) {
	p, err1 := strconv.Atoi(msg.Metadata.Get(outbox.MetadataPartition))
	seq, err2 := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataSeq), 10, 64)
	if err1 != nil || err2 != nil || p < 0 || p >= partitionCount {
		o.fail(fmt.Errorf("bad metadata %v", msg.Metadata))
		return
	}
	if prev := o.last[p].Load(); seq != prev+1 {
		o.fail(fmt.Errorf("partition %d: seq %d after %d", p, seq, prev))
	}
	o.last[p].Store(seq)
}

func (o *partitionOrder) fail(err error) { o.err.CompareAndSwap(nil, &err) }

func (o *partitionOrder) failure() error {
	if p := o.err.Load(); p != nil {
		return *p
	}
	return nil
}

// runSubscriberDrain publishes and sequences a backlog of n messages
// (untimed), then times a Subscriber with the high-throughput profile
// delivering all of them, through Subscribe (acking at once) or
// ConsumeBatches, and checks order and completeness.
func runSubscriberDrain(ctx context.Context, e *env, t timer, mode drainMode, n int) (res drainResult, err error) {
	schema, err := e.newSchema(ctx, "drain")
	if err != nil {
		return res, err
	}
	defer func() { _ = e.dropSchema(context.WithoutCancel(ctx), schema) }()
	target, err := setupOutbox(ctx, e, schema, true)
	if err != nil {
		return res, err
	}
	err = e.publishConcurrently(ctx, n, 100, payloadSize, func(ctx context.Context, tx pgx.Tx, g *gen, k int) error {
		return target.publish(ctx, tx, g.messages(k))
	})
	if err != nil {
		return res, fmt.Errorf("backlog: %w", err)
	}
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: e.pool}, nil)
	if err != nil {
		return res, err
	}
	if got, err := seq.SequenceAll(ctx); err != nil || got != n {
		return res, fmt.Errorf("sequenced %d of %d (%v)", got, n, err)
	}
	// A steady state: hint bits set, visibility map and statistics fresh
	// (autovacuum would have done so in a running system), and no
	// checkpoint due during the timed phase.
	for _, table := range []string{"log", "pending", "partitions"} {
		if _, err := e.admin.Exec(ctx, sqlFor(schema, "VACUUM (ANALYZE) {{s}}."+table)); err != nil {
			return res, err
		}
	}
	if err := e.maybeCheckpoint(ctx); err != nil {
		return res, err
	}
	pool, err := newSubPool(ctx)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	// Open the connections before the timer, as a running service has them.
	if err := warmPool(ctx, pool, 20); err != nil {
		return res, err
	}
	cfg := outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: subGroup, Tuning: adaptive.HighThroughput()}
	if *subNoPacing {
		cfg.Advanced.PollInterval = time.Nanosecond
	}
	sub, err := outbox.NewSubscriber(cfg, nil)
	if err != nil {
		return res, err
	}
	defer sub.Close()

	var order partitionOrder
	var delivered atomic.Int64
	var firstAt, lastAt atomic.Int64
	var start time.Time
	seen := func(k int) {
		now := int64(time.Since(start))
		firstAt.CompareAndSwap(0, now)
		if delivered.Add(int64(k)) == int64(n) {
			lastAt.Store(now)
		}
	}
	subCtx, stopSub := context.WithCancel(ctx)
	defer stopSub()
	var consumerDone chan struct{}

	var stopSampling func() (map[string]int, int)
	if *subSample {
		if stopSampling, err = sampleActivity(ctx, schema); err != nil {
			return res, err
		}
	}
	var profile *os.File
	if *subProfile != "" {
		if profile, err = os.Create(fmt.Sprintf("%s-%s.pprof", *subProfile, mode)); err != nil {
			return res, err
		}
		defer profile.Close()
	}
	before := e.sched()
	ph, err := e.measure(ctx, t, n, func() error {
		if profile != nil {
			if err := pprof.StartCPUProfile(profile); err != nil {
				return err
			}
			defer pprof.StopCPUProfile()
		}
		start = time.Now()
		consumerDone = make(chan struct{})
		switch mode {
		case drainSubscribe:
			ch, err := sub.Subscribe(subCtx, topic)
			if err != nil {
				return err
			}
			var consumers sync.WaitGroup
			for range max(*subConsumers, 1) {
				consumers.Go(func() {
					for msg := range ch {
						order.see(msg)
						msg.Ack()
						seen(1)
					}
				})
			}
			go func() {
				consumers.Wait()
				close(consumerDone)
			}()
		case drainBatches:
			go func() {
				defer close(consumerDone)
				err := sub.ConsumeBatches(subCtx, topic, func(_ context.Context, batch []*message.Message) (int, error) {
					for _, msg := range batch {
						order.see(msg)
					}
					seen(len(batch))
					return len(batch), nil
				})
				if err != nil {
					order.fail(err)
				}
			}()
		}
		deadline := time.Now().Add(5 * time.Minute)
		for delivered.Load() < int64(n) {
			if err := order.failure(); err != nil {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%d of %d delivered after 5 minutes", delivered.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	res.sched = e.sched().since(before)
	if stopSampling != nil {
		res.samples, res.nSamples = stopSampling()
	}
	if err != nil {
		return res, err
	}
	res.phase = ph
	res.first = time.Duration(firstAt.Load())
	res.deliver = time.Duration(lastAt.Load())
	if res.deliver > res.first {
		res.steady = float64(n-1) / (res.deliver - res.first).Seconds()
	}
	// The cursors catch up once the last batches' Advance ran.
	lagging := sqlFor(schema, `SELECT count(*) FROM {{s}}.cursors c JOIN {{s}}.partitions p USING (topic, partition)
		WHERE c.group_name = '`+subGroup+`' AND c.seq <> p.last_seq`)
	for deadline := time.Now().Add(30 * time.Second); ; {
		left, err := e.count(ctx, lagging)
		if err != nil {
			return res, err
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%d cursors short of their partition's last seq", left)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopSub()
	_ = sub.Close()
	<-consumerDone
	if err := order.failure(); err != nil {
		return res, err
	}
	if got := delivered.Load(); got != int64(n) {
		return res, fmt.Errorf("delivered %d, want %d", got, n)
	}
	// Every partition delivered up to its last seq (no redelivery above:
	// order.see rejects any seq but last+1).
	var sum int64
	for p := range partitionCount {
		sum += order.last[p].Load()
	}
	if sum != int64(n) {
		return res, fmt.Errorf("partitions delivered up to seqs summing to %d, want %d", sum, n)
	}
	return res, nil
}

// warmPool opens k connections of pool and gives them back.
func warmPool(ctx context.Context, pool *pgxpool.Pool, k int) error {
	conns := make([]*pgxpool.Conn, 0, k)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range k {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

var (
	spaces    = regexp.MustCompile(`\s+`)
	schemaRef = regexp.MustCompile(`"?drain_[0-9a-f]+"?\.`)
)

// sampleActivity samples, every 2ms, what the server's other backends of
// this database are doing (statement and wait event) until the returned
// function is called, which returns the counts.
func sampleActivity(ctx context.Context, schema string) (stop func() (map[string]int, int), err error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	counts := map[string]int{}
	samples := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Close(context.Background())
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			rows, err := conn.Query(ctx, `SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), query
				FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND datname = current_database()`)
			if err != nil {
				return
			}
			samples++
			for rows.Next() {
				var wait, query string
				if rows.Scan(&wait, &query) == nil {
					q := schemaRef.ReplaceAllString(spaces.ReplaceAllString(query, " "), "")
					if len(q) > 90 {
						q = q[:90]
					}
					counts[wait+" | "+q]++
				}
			}
			rows.Close()
		}
	}()
	return func() (map[string]int, int) {
		cancel()
		<-done
		return counts, samples
	}, nil
}

func printSamples(name string, counts map[string]int, samples int) {
	type kv struct {
		k string
		v int
	}
	var all []kv
	total := 0
	for k, v := range counts {
		all = append(all, kv{k, v})
		total += v
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	fmt.Printf("%s: pg_stat_activity, %d samples, %.2f active backends on average; top (wait | statement):\n",
		name, samples, float64(total)/float64(max(samples, 1)))
	for i, x := range all {
		if i == 12 {
			break
		}
		fmt.Printf("  %5.1f%%  %s\n", 100*float64(x.v)/float64(max(total, 1)), x.k)
	}
}

// BenchmarkDrain16Partitions measures how fast a Subscriber with the
// high-throughput profile delivers a backlog of -sub.backlog messages (256
// B, 1,000 keys, 16 partitions, published and sequenced before the timer)
// through Subscribe with a consumer that acks at once and through
// ConsumeBatches. b.N is ignored.
func BenchmarkDrain16Partitions(b *testing.B) {
	e := newEnv(b, true)
	modes := []drainMode{drainSubscribe, drainBatches}
	for range *rounds {
		for _, mode := range modes {
			b.Run(string(mode), func(b *testing.B) { benchSubscriberDrain(b, e, mode) })
		}
	}
	metrics := []string{"msgs/s", "steady-msgs/s", "first-ms", "cpu-us/msg", "cpu-cores", "runq/cpu"}
	printMedians(b.Name(), []string{string(drainSubscribe), string(drainBatches)}, metrics)
	var parts []string
	for _, m := range metrics[:2] {
		bt, okB := lookup(b.Name()+"/"+string(drainBatches), m)
		sb, okS := lookup(b.Name()+"/"+string(drainSubscribe), m)
		parts = append(parts, fmt.Sprintf("%s %s", m, ratio(bt, sb, okB, okS)))
	}
	fmt.Printf("%s: ratio of medians batches/subscribe: %s\n", b.Name(), strings.Join(parts, ", "))
}

func benchSubscriberDrain(b *testing.B, e *env, mode drainMode) {
	b.StopTimer()
	b.ResetTimer()
	res, err := runSubscriberDrain(context.Background(), e, b, mode, *subBacklog)
	if err != nil {
		b.Fatal(err)
	}
	warnCheckpoints(b, "drain", res.phase)
	b.ReportMetric(0, "ns/op")
	m := map[string]float64{
		"msgs/s":        res.rate(),
		"steady-msgs/s": res.steady,
		"first-ms":      ms(res.first),
		"WAL-B/msg":     res.walPerMsg(),
	}
	addCPU(m, "", res.phase)
	addSched(m, res.sched, res.dur)
	report(b, m)
	fmt.Printf("%s: %d msgs in %v (first after %v): %.0f msgs/s, %.0f msgs/s after the first; %.1f µs CPU/msg (server+client, %.0f%% client), %.2f cores, run-queue wait %.2f s per CPU s, %.0f B WAL/msg\n",
		b.Name(), res.msgs, res.dur.Round(time.Millisecond), res.first.Round(time.Millisecond), m["msgs/s"], res.steady, m["cpu-us/msg"], 100*m["client-cpu-share"], m["cpu-cores"], m["runq/cpu"], m["WAL-B/msg"])
	if res.samples != nil {
		printSamples(b.Name(), res.samples, res.nSamples)
	}
}

// ---------------------------------------------------------------------------

// TestSmokeSubscriberBenchmarks runs both benchmark bodies at a tiny size
// and checks that every message arrived (the bodies check exactly once and,
// for the drain, in order).
func TestSmokeSubscriberBenchmarks(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	t.Run("CommitToHandlerLatency", func(t *testing.T) {
		for _, p := range latencyProfiles {
			t.Run(p.name, func(t *testing.T) {
				res, err := runLatency(ctx, e, noTimer{}, latencyConfig{
					tuning: p.tuning(), rate: 200, warmup: 100 * time.Millisecond, duration: time.Second,
				})
				if err != nil {
					t.Fatal(err)
				}
				if res.published != 220 || res.measured != 200 || len(res.lat) != 200 || res.dups != 0 {
					t.Fatalf("published %d, measured %d, %d latencies, %d redelivered", res.published, res.measured, len(res.lat), res.dups)
				}
				if len(res.toSeq) != 200 {
					t.Fatalf("%d messages found in the log, want 200", len(res.toSeq))
				}
				t.Logf("p50 %.2f ms, p99 %.2f ms, max %.2f ms", ms(percentile(res.lat, 0.5)), ms(percentile(res.lat, 0.99)), ms(res.lat[len(res.lat)-1]))
			})
		}
	})
	t.Run("Drain16Partitions", func(t *testing.T) {
		for _, mode := range []drainMode{drainSubscribe, drainBatches} {
			t.Run(string(mode), func(t *testing.T) {
				const n = 2000
				res, err := runSubscriberDrain(ctx, e, noTimer{}, mode, n)
				if err != nil {
					t.Fatal(err)
				}
				if res.msgs != n || res.dur <= 0 {
					t.Fatalf("implausible result %+v", res.phase)
				}
				t.Logf("%d msgs in %v", n, res.dur)
			})
		}
	})
}
