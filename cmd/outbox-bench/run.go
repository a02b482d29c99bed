package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/procstat"
	"github.com/millrace/watermill-outbox/pgtemp"
)

// Systems, in the order they run.
const (
	sysCeiling = "ceiling"
	sysPeer    = "peer"
	// sysPeerTuned is (b) tuned as far as watermill-sql's options go.
	sysPeerTuned = "peer-tuned"
	sysOutbox    = "outbox"
	// sysOutboxALO is (c) with exactly-once delivery into Kafka turned
	// off (kafka.Config.AtLeastOnce): what the Kafka
	// transactions cost.
	sysOutboxALO = "outbox-alo"
	// sysOutboxWAL is (c) in the log-based mode (outbox.ModeWAL and a
	// relay.Relay), not run unless named in -systems.
	sysOutboxWAL = "outbox-wal"
)

// bench is the shared environment: the database and the workload.
type bench struct {
	cfg        config
	dbURL      string
	admin      *pgx.Conn // only the goroutine driving the phases uses it
	postmaster int
	// pgss: pg_stat_statements is loaded and its extension created.
	pgss    bool
	keys    []string
	payload []byte
}

// run starts the database, runs the phases of cfg and writes the outputs.
// The outputs are written even when a phase fails (with what was measured
// until then). It returns an error when a phase failed or a run did not get
// every message to the broker.
func run(ctx context.Context, cfg config) error {
	start := time.Now()
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	machine := describeMachine()
	logf("machine: %s", machine.String())

	naptime := 5 * time.Second
	if slices.Equal(cfg.phases, []string{phaseSoak}) {
		naptime = cfg.soakNaptime
	}
	cluster, pgss, err := startCluster(ctx, naptime)
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
	if pgss {
		b.pgss = b.createPGSS(ctx)
	}
	logf("PostgreSQL %s on 127.0.0.1:%d (pg_stat_statements: %v); Kafka: a fresh in-process kfake broker per run",
		machine.PostgreSQL, cluster.Port(), b.pgss)

	for i := range cfg.keys {
		b.keys = append(b.keys, fmt.Sprintf("key-%05d", i))
	}
	b.payload = benchPayload(cfg.payload)

	res := &results{Machine: machine, Config: jsonConfig(cfg), Started: start.UTC().Format(time.RFC3339), PGStatStatements: b.pgss}
	phaseErr := b.runPhases(ctx, res)
	res.Seconds = time.Since(start).Seconds()
	if err := res.write(cfg.out); err != nil {
		return errors.Join(phaseErr, err)
	}
	fmt.Println()
	fmt.Print(res.markdown())
	logf("wrote %s/results.json, results.md, statements.md and the PNGs in %.0f s", cfg.out, res.Seconds)
	if phaseErr != nil {
		return phaseErr
	}
	return res.incomplete()
}

// runPhases runs the phases of b.cfg, in order, into res.
func (b *bench) runPhases(ctx context.Context, res *results) error {
	if b.cfg.has(phaseCompare) && b.cfg.publishRounds > 0 && slices.Contains(b.cfg.systems, sysCeiling) && slices.Contains(b.cfg.systems, sysOutbox) {
		if err := b.publishRoundsPhase(ctx, res); err != nil {
			return fmt.Errorf("compare, publish rounds: %w", err)
		}
	}
	if b.cfg.has(phaseCompare) {
		if err := b.comparePhase(ctx, res); err != nil {
			return fmt.Errorf("compare: %w", err)
		}
	}
	if b.cfg.has(phaseLatency) {
		if err := b.latencyPhase(ctx, res); err != nil {
			return fmt.Errorf("latency: %w", err)
		}
	}
	if b.cfg.has(phaseGrowth) {
		if err := b.growthPhase(ctx, res); err != nil {
			return fmt.Errorf("growth: %w", err)
		}
	}
	if b.cfg.has(phaseIsolation) {
		if err := b.isolationPhase(ctx, res); err != nil {
			return fmt.Errorf("isolation: %w", err)
		}
	}
	if b.cfg.has(phaseIdle) {
		if err := b.idlePhase(ctx, res); err != nil {
			return fmt.Errorf("idle: %w", err)
		}
	}
	if b.cfg.has(phaseSoak) {
		if err := b.soakPhase(ctx, res); err != nil {
			return fmt.Errorf("soak: %w", err)
		}
	}
	if b.cfg.has(phaseSources) {
		if err := b.sourcesPhase(ctx, res); err != nil {
			return fmt.Errorf("sources: %w", err)
		}
	}
	return nil
}

// startCluster starts a throwaway durable cluster with pg_stat_statements
// preloaded (tracking nested statements too); when the server does not
// start that way, it warns and starts one without. The bool reports whether
// the library is loaded.
//
// Autovacuum visits each database every naptime: 5 s for every phase but
// a soak run alone (-soak-naptime), so that the space of deleted rows is
// reused within a run of a minute or two, as it would be over the hours
// of a service (docs/operations.md asks for aggressive autovacuum on the
// outbox tables); it applies to every system alike. A soak runs for hours
// and shows what the server's own setting gives.
func startCluster(ctx context.Context, naptime time.Duration) (*pgcluster.Cluster, bool, error) {
	logf("starting a durable PostgreSQL cluster (fsync, synchronous_commit, full_page_writes on; autovacuum_naptime %v)", naptime)
	settings := map[string]string{
		// Room for a whole run between the CHECKPOINTs taken before each
		// measured run.
		"max_wal_size":             "16GB",
		"autovacuum_naptime":       fmt.Sprintf("%ds", max(1, int(naptime.Seconds()))),
		"shared_preload_libraries": "pg_stat_statements",
		"pg_stat_statements.track": "all",
		// The log-based mode (e) needs logical decoding; every system runs
		// on the same server (logical adds a little to the WAL of row
		// changes, alike for all).
		"wal_level":             "logical",
		"max_replication_slots": "64",
		"max_wal_senders":       "64",
		// The sources phase's many-sources run: a fleet's connections to
		// 50 databases.
		"max_connections": "400",
	}
	// The PostgreSQL installed, else binaries cached or fetched once
	// (package pgtemp).
	fctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	bindir, err := pgtemp.BinDir(fctx, pgtemp.FetchOptions{})
	cancel()
	if err != nil {
		return nil, false, err
	}
	cache, _ := pgcluster.CacheDir()
	fetched := cache != "" && strings.HasPrefix(bindir, cache+string(filepath.Separator)) // a tree that works wherever it is
	start := func() (*pgcluster.Cluster, error) {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		return pgcluster.Start(sctx, pgcluster.Options{Durable: true, Settings: settings, BinDir: bindir, Movable: fetched})
	}
	cluster, err := start()
	if err == nil || errors.Is(err, pgcluster.ErrNoServerBinaries) {
		return cluster, err == nil, err
	}
	logf("warning: PostgreSQL did not start with pg_stat_statements (%v); going on without it", err)
	delete(settings, "shared_preload_libraries")
	delete(settings, "pg_stat_statements.track")
	cluster, err = start()
	return cluster, false, err
}

// broker is a fresh in-process Kafka broker for one run.
type broker struct {
	cluster *kfake.Cluster
	addrs   []string
	counter *brokerCounter
}

// newBroker starts a one-broker kfake cluster with topics of partitions
// partitions each. A fresh broker per run: kfake keeps records in memory,
// and one run's records must not count in the next one's RSS. With
// trimmable, segments roll at 1 MiB, so that records deleted with
// DeleteRecords free their memory (kfake frees whole segments only; the
// default segment is 100 MiB).
func newBroker(partitions int, trimmable bool, topics ...string) (*broker, error) {
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), topics...)}
	if trimmable {
		opts = append(opts, kfake.BrokerConfigs(map[string]string{"log.segment.bytes": "1048576"}))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("kfake: %w", err)
	}
	k := &broker{cluster: c, addrs: c.ListenAddrs()}
	k.counter = newBrokerCounter(k.addrs)
	return k, nil
}

func (k *broker) Close() {
	k.counter.Close()
	k.cluster.Close()
}

func logf(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
}

// createSchema creates a fresh schema for one run.
func (b *bench) createSchema(ctx context.Context, schema string) error {
	_, err := b.admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	return err
}

// freshSystem creates schema, a fresh broker with topic (of partitions
// partitions; trim: small segments, so that deleting records frees memory)
// and system name in them, its relay not started. The caller closes the
// broker and stops the system.
func (b *bench) freshSystem(ctx context.Context, name, schema, topic string, partitions int, trim bool, tuning adaptive.Tuning) (*broker, *system, error) {
	if err := b.createSchema(ctx, schema); err != nil {
		return nil, nil, err
	}
	kb, err := newBroker(partitions, trim, topic)
	if err != nil {
		return nil, nil, err
	}
	sys, err := b.setup(ctx, name, schema, topic, kb.addrs, outboxOptions{partitions: partitions, tuning: tuning})
	if err != nil {
		kb.Close()
		return nil, nil, err
	}
	return kb, sys, nil
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

// warmPool returns a pool of n connections, all of them connected, so that
// connecting is not measured.
func (b *bench) warmPool(ctx context.Context, n int) (*pgxpool.Pool, error) {
	pool, err := b.pool(ctx, n)
	if err != nil {
		return nil, err
	}
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			pool.Close()
			return nil, err
		}
		conns = append(conns, c)
	}
	return pool, nil
}

// beforeRun is what every measured run does just before it starts: a
// CHECKPOINT (so that no checkpoint of an earlier run's WAL falls into it),
// a GC that returns memory to the OS, a reset of the peak RSS and of
// pg_stat_statements.
func (b *bench) beforeRun(ctx context.Context) error {
	if _, err := b.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	debug.FreeOSMemory()
	resetPeakRSS()
	b.resetPGSS(ctx)
	return nil
}

func sqlFor(schema, stmt string) string {
	return strings.ReplaceAll(stmt, "{{s}}", pgx.Identifier{schema}.Sanitize())
}

// benchPayload returns size bytes of pseudo-random hex text (fixed seed).
// PostgreSQL's pglz finds nothing to compress in it, so a large payload
// costs its full size in every table and in the WAL, as an encrypted or
// already-compressed payload does. (A repeating alphabet, used before,
// compressed 64 KiB to a few hundred bytes and hid the cost of copying
// large payloads.)
func benchPayload(size int) []byte {
	const hex = "0123456789abcdef"
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, size)
	for i := range b {
		b[i] = hex[rng.IntN(len(hex))]
	}
	return b
}
