package main

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/procstat"
)

// Systems, in the order they run.
const (
	sysCeiling = "ceiling"
	sysPeer    = "peer"
	sysOutbox  = "outbox"
)

// bench is the shared environment: the database, the broker, the workload.
type bench struct {
	cfg        config
	dbURL      string
	admin      *pgx.Conn
	postmaster int
	brokers    []string       // of the current run's broker
	counter    *brokerCounter // of the current run's broker
	keys       []string
	payload    []byte
}

// system is one way of publishing (and relaying) set up for one run.
type system struct {
	// publish writes one transaction's messages with tx.
	publish func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error
	// kafkaTopic is where the relay delivers; "" for the ceiling.
	kafkaTopic string
	// stop stops the relay.
	stop func()
}

func run(ctx context.Context, cfg config) error {
	start := time.Now()
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	machine := describeMachine()
	logf("machine: %s", machine.String())

	logf("starting a durable PostgreSQL cluster (fsync, synchronous_commit, full_page_writes on)")
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	cluster, err := pgcluster.Start(sctx, pgcluster.Options{
		Durable: true,
		// Room for a whole run between the CHECKPOINTs taken before each
		// measured phase.
		Settings: map[string]string{"max_wal_size": "16GB"},
	})
	cancel()
	if err != nil {
		return err
	}
	defer cluster.Stop()

	b := &bench{cfg: cfg, dbURL: cluster.URL("postgres")}
	if b.admin, err = pgx.Connect(ctx, b.dbURL); err != nil {
		return err
	}
	defer b.admin.Close(context.Background())
	var backend int
	if err := b.admin.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return err
	}
	b.postmaster = procstat.PostmasterOf(backend)
	if err := b.admin.QueryRow(ctx, "SELECT split_part(version(), ' on ', 1)").Scan(&machine.PostgreSQL); err != nil {
		return err
	}

	logf("PostgreSQL %s on 127.0.0.1:%d; Kafka: a fresh in-process kfake broker per run", machine.PostgreSQL, cluster.Port())

	for i := range cfg.keys {
		b.keys = append(b.keys, fmt.Sprintf("key-%05d", i))
	}
	b.payload = make([]byte, cfg.payload)
	for i := range b.payload {
		b.payload[i] = byte('a' + i%26)
	}

	res := &results{Machine: machine, Config: jsonConfig(cfg), Started: start.UTC().Format(time.RFC3339)}
	for _, perTx := range cfg.perTx {
		for _, name := range []string{sysCeiling, sysPeer, sysOutbox} {
			r, err := b.runOne(ctx, name, perTx)
			if err != nil {
				return fmt.Errorf("%s, %d/tx: %w", name, perTx, err)
			}
			res.Runs = append(res.Runs, r)
		}
	}
	res.Ratios = ratios(res.Runs, cfg.perTx)
	res.Seconds = time.Since(start).Seconds()
	if err := res.write(cfg.out); err != nil {
		return err
	}
	fmt.Println()
	fmt.Print(res.markdown())
	logf("wrote %s/results.json, results.md and throughput.png in %.0f s", cfg.out, res.Seconds)
	for _, r := range res.Runs {
		if !r.Complete && r.System != sysCeiling {
			return fmt.Errorf("%s, %d/tx: only %d of %d messages reached the broker within -max-drain", r.System, r.PerTx, r.AtBroker, r.Messages)
		}
	}
	return nil
}

func kafkaTopic(sys string, perTx int) string { return fmt.Sprintf("%s-pt%d", sys, perTx) }

func logf(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
}

// runOne sets up system name in a fresh schema, publishes cfg.messages
// messages in transactions of perTx while the relay runs, and waits until
// all of them are at the broker.
func (b *bench) runOne(ctx context.Context, name string, perTx int) (*runResult, error) {
	cfg := b.cfg
	schema := fmt.Sprintf("%s_pt%d", name, perTx)
	if _, err := b.admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, err
	}
	// A fresh broker per run: kfake keeps every record in memory, and one
	// run's records must not count in the next one's peak RSS.
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(cfg.partitions), kafkaTopic(sysPeer, perTx), kafkaTopic(sysOutbox, perTx)))
	if err != nil {
		return nil, fmt.Errorf("kfake: %w", err)
	}
	b.brokers = kafka.ListenAddrs()
	if b.counter, err = newBrokerCounter(b.brokers, int32(cfg.partitions)); err != nil {
		kafka.Close()
		return nil, err
	}
	defer func() {
		b.counter.Close()
		kafka.Close()
	}()
	var sys *system
	switch name {
	case sysCeiling:
		sys, err = b.setupCeiling(ctx, schema)
	case sysPeer:
		sys, err = b.setupPeer(ctx, schema, kafkaTopic(name, perTx))
	case sysOutbox:
		sys, err = b.setupOutbox(ctx, schema, kafkaTopic(name, perTx))
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		if sys.stop != nil {
			sys.stop()
		}
	}()

	pool, err := b.pool(ctx, cfg.publishers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	// Warm the connections up, so that connecting is not measured.
	var conns []*pgxpool.Conn
	for range cfg.publishers {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	if _, err := b.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return nil, err
	}
	debug.FreeOSMemory()
	resetPeakRSS()

	baseAt := int64(0)
	if sys.kafkaTopic != "" {
		if baseAt, err = b.counter.Count(ctx, sys.kafkaTopic); err != nil {
			return nil, err
		}
	}
	txs := (cfg.messages + perTx - 1) / perTx
	r := &runResult{System: name, PerTx: perTx, Messages: txs * perTx, Publishers: cfg.publishers}
	logf("%s, %d msg/tx: publishing %d messages in %d transactions with %d publishers%s", name, perTx, r.Messages, txs,
		cfg.publishers, map[bool]string{true: ", relaying to Kafka topic " + sys.kafkaTopic, false: ""}[sys.kafkaTopic != ""])

	cpu0 := readCPU(b.postmaster)
	t0 := time.Now()
	var published atomic.Int64
	var nextTx atomic.Int64
	var pubErr error
	var pubErrOnce sync.Once
	var wg sync.WaitGroup
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	for w := range cfg.publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(w)+1, uint64(perTx)))
			for nextTx.Add(1) <= int64(txs) {
				msgs := make([]*message.Message, perTx)
				for i := range msgs {
					m := message.NewMessage(watermill.NewUUID(), b.payload)
					m.Metadata.Set(outbox.PartitionKeyMetadata, b.keys[rng.IntN(len(b.keys))])
					msgs[i] = m
				}
				err := pgx.BeginFunc(pctx, pool, func(tx pgx.Tx) error { return sys.publish(pctx, tx, msgs) })
				if err != nil {
					pubErrOnce.Do(func() { pubErr = err; pcancel() })
					return
				}
				published.Add(int64(perTx))
			}
		}()
	}
	pubDone := make(chan struct{})
	var pubElapsed time.Duration
	go func() {
		wg.Wait()
		pubElapsed = time.Since(t0)
		close(pubDone)
	}()

	// Sample the broker's end offsets until every message is there.
	var samples []sample
	var e2eElapsed time.Duration
	lastLog := t0
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	pubFinished := false
	deadline := time.Time{}
	for {
		select {
		case <-pubDone:
			pubFinished = true
			pubDone = nil
			if pubErr != nil {
				return nil, fmt.Errorf("publish: %w", pubErr)
			}
			r.PublishSeconds = pubElapsed.Seconds()
			r.PublishRate = float64(r.Messages) / pubElapsed.Seconds()
			deadline = time.Now().Add(cfg.maxDrain)
			logf("%s, %d msg/tx: published %d in %.2f s: %.0f msg/s", name, perTx, r.Messages, pubElapsed.Seconds(), r.PublishRate)
			if sys.kafkaTopic == "" {
				r.Complete = true
				r.finish(cpu0, readCPU(b.postmaster))
				return r, nil
			}
		case <-tick.C:
		}
		if sys.kafkaTopic == "" {
			continue
		}
		n, err := b.counter.Count(ctx, sys.kafkaTopic)
		if err != nil {
			return nil, fmt.Errorf("count broker offsets: %w", err)
		}
		n -= baseAt
		now := time.Now()
		samples = append(samples, sample{T: now.Sub(t0).Seconds(), Published: published.Load(), AtBroker: n})
		if n >= int64(r.Messages) {
			e2eElapsed = now.Sub(t0)
			r.AtBroker = n
			r.Complete = true
			break
		}
		if pubFinished && now.After(deadline) {
			e2eElapsed = now.Sub(t0)
			r.AtBroker = n
			logf("%s, %d msg/tx: gave up after -max-drain %v with %d of %d at the broker", name, perTx, cfg.maxDrain, n, r.Messages)
			break
		}
		if now.Sub(lastLog) >= 2*time.Second {
			lastLog = now
			logf("%s, %d msg/tx: %6.1f s  published %d  at broker %d", name, perTx, now.Sub(t0).Seconds(), published.Load(), n)
		}
	}
	r.finish(cpu0, readCPU(b.postmaster))
	r.EndToEndSeconds = e2eElapsed.Seconds()
	r.EndToEndRate = float64(r.AtBroker) / e2eElapsed.Seconds()
	r.Samples = samples
	logf("%s, %d msg/tx: %d at the broker %.2f s after the first publish: %.0f msg/s end to end; CPU %.1f s (process %.1f, postgres %.1f), peak RSS %d MiB",
		name, perTx, r.AtBroker, r.EndToEndSeconds, r.EndToEndRate, r.CPUSeconds, r.ProcessCPUSeconds, r.PostgresCPUSeconds, r.PeakRSSBytes>>20)
	return r, nil
}

func (r *runResult) finish(c0, c1 cpuSample) {
	r.ProcessCPUSeconds = (c1.process - c0.process).Seconds()
	r.PostgresCPUSeconds = (c1.server - c0.server).Seconds()
	r.CPUSeconds = r.ProcessCPUSeconds + r.PostgresCPUSeconds
	if r.Messages > 0 {
		r.CPUMicrosPerMessage = r.CPUSeconds * 1e6 / float64(r.Messages)
	}
	r.PeakRSSBytes = peakRSS()
}

// pool returns a pool of at most n connections.
func (b *bench) pool(ctx context.Context, n int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = int32(n)
	return pgxpool.NewWithConfig(ctx, pc)
}

func sqlFor(schema, stmt string) string {
	return strings.ReplaceAll(stmt, "{{s}}", pgx.Identifier{schema}.Sanitize())
}
