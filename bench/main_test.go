// Package bench holds the benchmarks of the outbox core: what publishing
// costs next to a plain INSERT, what NOTIFY costs, which table layout
// sequences best, and how fast the real Sequencer drains a backlog.
//
// TestMain starts one durable throwaway PostgreSQL cluster (fsync and
// synchronous_commit on) for the whole package; OUTBOX_BENCH_DATABASE_URL
// points the package at an existing server instead (it needs the right to
// run CHECKPOINT and CREATE SCHEMA; CPU figures need a local server).
//
// Every measured run reports messages per second, the WAL the server wrote
// per message and the CPU time (server processes + this process) per
// message. The -rounds flag repeats the variants of a benchmark, interleaved,
// and the parent benchmarks print medians and ratios. TestSmoke runs every
// benchmark body once at a tiny size. See docs/benchmarks.md for how to run
// them and for the figures.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/internal/procstat"
	"github.com/millrace/watermill-outbox/partitioning"
)

// The workload every benchmark shares.
const (
	publishers     = 4    // concurrent publishing goroutines, one connection each
	payloadSize    = 256  // bytes per message unless a benchmark says otherwise
	keyCount       = 1000 // distinct partition keys
	partitionCount = 16   // partitions of the topic
	topic          = "bench"
	seqBatchSize   = 5000 // the Sequencer's default BatchSize, used by the raw layouts too
	readPage       = 1000 // rows per read query in the read phase
)

// EnvDatabaseURL names the environment variable that points the benchmarks
// at an existing server instead of a throwaway cluster.
const EnvDatabaseURL = "OUTBOX_BENCH_DATABASE_URL"

var (
	dbURL      string
	skipReason string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if url := os.Getenv(EnvDatabaseURL); url != "" {
		dbURL = url
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cluster, err := pgtest.StartCluster(ctx, pgcluster.Options{
		Durable: true,
		// Room for a whole benchmark run between the explicit CHECKPOINTs
		// taken before each measured phase, so that no checkpoint (and no
		// burst of full-page images) lands in the middle of one.
		Settings: map[string]string{"max_wal_size": "16GB"},
	})
	cancel()
	if errors.Is(err, pgcluster.ErrNoServerBinaries) {
		skipReason = err.Error()
		return m.Run()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer cluster.Stop()
	dbURL = cluster.URL("postgres")
	return m.Run()
}

// keys, their metadata JSON and their partitions, computed once.
var (
	keys     [keyCount]string
	keyMeta  [keyCount]string
	keyParts [keyCount]int32
)

func init() {
	p := partitioning.Default()
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%04d", i)
		keyMeta[i] = `{"partition_key": "` + keys[i] + `"}`
		n, err := p.Partition(keys[i], partitionCount)
		if err != nil {
			panic(err)
		}
		keyParts[i] = int32(n)
	}
}

// env is the connections one benchmark (or the smoke test) works through.
type env struct {
	admin      *pgx.Conn   // DDL, WAL positions, CHECKPOINT, checks
	workers    []*pgx.Conn // one per publisher goroutine
	pool       *pgxpool.Pool
	checkpoint bool // CHECKPOINT before each measured run (benchmarks only)
	postmaster int  // pid of the local server's postmaster, 0 when not local
}

func newEnv(tb testing.TB, checkpoint bool) *env {
	tb.Helper()
	if skipReason != "" {
		tb.Skip(skipReason)
	}
	ctx := context.Background()
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	e := &env{admin: connect(), checkpoint: checkpoint}
	var backend int
	if err := e.admin.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		tb.Fatal(err)
	}
	e.postmaster = procstat.PostmasterOf(backend)
	for range publishers {
		e.workers = append(e.workers, connect())
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 4
	if e.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.pool.Close)
	return e
}

// newSchema creates a fresh, empty schema and returns its quoted name; drop
// removes it.
func (e *env) newSchema(ctx context.Context, prefix string) (name string, err error) {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	name = prefix + "_" + hex.EncodeToString(b)
	_, err = e.admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize())
	return name, err
}

func (e *env) dropSchema(ctx context.Context, name string) error {
	_, err := e.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	return err
}

// ddl runs a script with {{s}} replaced by the quoted schema name.
func (e *env) ddl(ctx context.Context, schema, script string) error {
	_, err := e.admin.Exec(ctx, sqlFor(schema, script))
	return err
}

func sqlFor(schema, stmt string) string {
	return strings.ReplaceAll(stmt, "{{s}}", pgx.Identifier{schema}.Sanitize())
}

// maybeCheckpoint runs a CHECKPOINT (when e.checkpoint is set) so that
// every measured run starts from the same state, and waits until the
// checkpoint counter shows it: the counter is updated a moment after
// CHECKPOINT returns, and would otherwise be blamed on the next phase.
func (e *env) maybeCheckpoint(ctx context.Context) error {
	if !e.checkpoint {
		return nil
	}
	before, err := e.mark(ctx)
	if err != nil {
		return err
	}
	if _, err := e.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	for deadline := time.Now().Add(2 * time.Second); before.checkpoints >= 0 && time.Now().Before(deadline); {
		after, err := e.mark(ctx)
		if err != nil {
			return err
		}
		if after.checkpoints > before.checkpoints {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

func (e *env) count(ctx context.Context, query string) (int, error) {
	var n int
	err := e.admin.QueryRow(ctx, query).Scan(&n)
	return n, err
}

// mark is a point on the server's WAL and checkpoint counters and on the
// CPU time spent by the server and by this process.
type mark struct {
	lsn                  string
	checkpoints          int64
	serverCPU, clientCPU time.Duration
	serverCPUKnown       bool
}

func (e *env) mark(ctx context.Context) (mark, error) {
	var m mark
	m.serverCPU, m.clientCPU, m.serverCPUKnown = procstat.CPU(e.postmaster)
	if err := e.admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&m.lsn); err != nil {
		return m, err
	}
	// pg_stat_bgwriter has the counters up to PostgreSQL 16; later
	// versions moved them, and then they are simply not checked.
	if err := e.admin.QueryRow(ctx, "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter").Scan(&m.checkpoints); err != nil {
		m.checkpoints = -1
	}
	return m, nil
}

// phase is one measured stretch of work.
type phase struct {
	msgs        int
	dur         time.Duration
	walBytes    int64
	checkpoints int64 // checkpoints that ran during the phase (they inflate WAL)
	// CPU time the server and this process spent during the phase. It
	// depends much less than the rates on what else runs on the machine.
	serverCPU, clientCPU time.Duration
	serverCPUKnown       bool
}

// addCPU puts the CPU figures of the phases into m under prefix.
func addCPU(m map[string]float64, prefix string, phases ...phase) {
	var cpu time.Duration
	msgs := 0
	for _, p := range phases {
		if !p.serverCPUKnown {
			return
		}
		cpu += p.serverCPU + p.clientCPU
		msgs = max(msgs, p.msgs)
	}
	m[prefix+"cpu-us/msg"] = float64(cpu.Microseconds()) / float64(max(msgs, 1))
}

func (p phase) rate() float64 { return float64(p.msgs) / p.dur.Seconds() }

func (p phase) walPerMsg() float64 { return float64(p.walBytes) / float64(max(p.msgs, 1)) }

// timer is the part of testing.B a measured phase drives; the smoke test
// passes noTimer.
type timer interface {
	StartTimer()
	StopTimer()
}

type noTimer struct{}

func (noTimer) StartTimer() {}
func (noTimer) StopTimer()  {}

// measure runs fn for msgs messages with the timer running and returns its
// duration, the WAL the server wrote and the CPU time spent meanwhile.
func (e *env) measure(ctx context.Context, t timer, msgs int, fn func() error) (phase, error) {
	before, err := e.mark(ctx)
	if err != nil {
		return phase{}, err
	}
	t.StartTimer()
	start := time.Now()
	err = fn()
	dur := time.Since(start)
	t.StopTimer()
	if err != nil {
		return phase{}, err
	}
	after, err := e.mark(ctx)
	if err != nil {
		return phase{}, err
	}
	var wal int64
	if err := e.admin.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint", after.lsn, before.lsn).Scan(&wal); err != nil {
		return phase{}, err
	}
	ph := phase{msgs: msgs, dur: dur, walBytes: wal,
		serverCPU: after.serverCPU - before.serverCPU, clientCPU: after.clientCPU - before.clientCPU,
		serverCPUKnown: before.serverCPUKnown && after.serverCPUKnown}
	if before.checkpoints >= 0 {
		ph.checkpoints = after.checkpoints - before.checkpoints
	}
	return ph, nil
}

// publishConcurrently splits total messages into transactions of perTx
// (the last may be smaller) and runs them on the worker connections, one
// goroutine each: BEGIN, fn, COMMIT.
func (e *env) publishConcurrently(ctx context.Context, total, perTx, payload int, fn func(ctx context.Context, tx pgx.Tx, g *gen, n int) error) error {
	txs := (total + perTx - 1) / perTx
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, len(e.workers))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for w, conn := range e.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := newGen(w, payload)
			for {
				i := int(next.Add(1) - 1)
				if i >= txs {
					return
				}
				n := min(perTx, total-i*perTx)
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return fn(ctx, tx, g, n) })
				if err != nil {
					errc <- err
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// gen makes one publisher's messages: random keys out of keyCount, fresh
// UUIDs, and a random payload of the requested size (shared by all its
// messages; random so that PostgreSQL cannot compress it).
type gen struct {
	rng     *mrand.Rand
	payload []byte
}

func newGen(worker, size int) *gen {
	g := &gen{rng: mrand.New(mrand.NewPCG(uint64(worker)+1, uint64(time.Now().UnixNano())))}
	g.payload = make([]byte, size)
	for i := range g.payload {
		g.payload[i] = byte(g.rng.Uint32())
	}
	return g
}

func (g *gen) key() int { return g.rng.IntN(keyCount) }

// rounds repeats every sub-benchmark, interleaved: round 1 runs each
// variant once, then round 2, and so on, so that a burst of load from
// elsewhere on the machine does not fall on one variant only. The parents
// print medians over the rounds (repeated sub-benchmarks get Go's "#01",
// "#02" name suffixes).
var rounds = flag.Int("rounds", 1, "run each benchmark variant this many times, interleaved, and print medians")

// results keeps the figures of each sub-benchmark run, by name without the
// "#NN" suffix, so that the parents can print medians and ratios. A run is
// keyed by its *testing.B: Go calls a benchmark first with b.N = 1 and then
// with the real b.N on the same B, and only the last call counts.
var results = struct {
	sync.Mutex
	m map[string]map[*testing.B]map[string]float64
}{m: map[string]map[*testing.B]map[string]float64{}}

var roundSuffix = regexp.MustCompile(`#[0-9]+$`)

func baseName(name string) string { return roundSuffix.ReplaceAllString(name, "") }

func record(b *testing.B, metrics map[string]float64) {
	results.Lock()
	defer results.Unlock()
	name := baseName(b.Name())
	if results.m[name] == nil {
		results.m[name] = map[*testing.B]map[string]float64{}
	}
	results.m[name][b] = metrics
}

// lookup returns the median of metric over the runs of the named
// sub-benchmark so far.
func lookup(name, metric string) (float64, bool) {
	vs := values(name, metric)
	if len(vs) == 0 {
		return 0, false
	}
	if len(vs)%2 == 1 {
		return vs[len(vs)/2], true
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2, true
}

// values returns the figures of metric over the runs of the named
// sub-benchmark so far, sorted.
func values(name, metric string) []float64 {
	results.Lock()
	defer results.Unlock()
	var vs []float64
	for _, m := range results.m[baseName(name)] {
		if v, ok := m[metric]; ok {
			vs = append(vs, v)
		}
	}
	sort.Float64s(vs)
	return vs
}

// sibling returns the full name of the sub-benchmark next to name.
func sibling(name, sub string) string {
	name = baseName(name)
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		return name[:i+1] + sub
	}
	return sub
}

// report publishes metrics on b (sorted, for stable output) and records them.
func report(b *testing.B, metrics map[string]float64) {
	units := make([]string, 0, len(metrics))
	for u := range metrics {
		units = append(units, u)
	}
	sort.Strings(units)
	for _, u := range units {
		b.ReportMetric(metrics[u], u)
	}
	record(b, metrics)
}

// printMedians prints, under parent, one line per sub-benchmark with the
// medians of the given metrics over its runs.
func printMedians(parent string, subs []string, metrics []string) {
	for _, sub := range subs {
		var parts []string
		for _, metric := range metrics {
			if v, ok := lookup(parent+"/"+sub, metric); ok {
				vs := values(parent+"/"+sub, metric)
				parts = append(parts, fmt.Sprintf("%s %s (%s..%s)", metric, formatFigure(v), formatFigure(vs[0]), formatFigure(vs[len(vs)-1])))
			}
		}
		fmt.Printf("%s/%s: median (min..max) of %d: %s\n", parent, sub, len(values(parent+"/"+sub, metrics[0])), strings.Join(parts, ", "))
	}
}

func warnCheckpoints(tb testing.TB, what string, p phase) {
	if p.checkpoints > 0 {
		tb.Logf("warning: %d checkpoint(s) ran during the %s phase; its WAL figure includes full-page images", p.checkpoints, what)
	}
}

func formatFigure(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// ratio formats a/b, or "n/a" when either figure is missing.
func ratio(a, b float64, okA, okB bool) string {
	if !okA || !okB || b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}
