package main

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// The soak phase (-phases soak, not run unless named): (c) with
// adaptive.Default() and the retention Vacuum on (KeepFor -soak-keep-for),
// publishing a steady -soak-rate msg/s (max(1, rate/1000) per transaction,
// -latency-publishers publishers) for -soak-duration, on a server whose
// autovacuum_naptime is -soak-naptime (PostgreSQL's default, 1 min, unless
// told) when the soak runs alone, the other phases' 5 s otherwise. Every -soak-interval it takes
// a sample: commit→broker p50/p99 and CPU per message (this process, which
// holds the Kafka broker too, and the PostgreSQL server) of the messages
// that arrived in the interval, RSS, Go heap, goroutines, the database's
// client connections, and every outbox table's live and dead rows and size
// on disk. The trends (soaktrend.go) fit a line to each after the warm-up
// and say whether it is flat, bounded or growing.

// soakResult is the soak phase.
type soakResult struct {
	Rate            int     `json:"offered_msgs_per_s"`
	PerTx           int     `json:"per_tx"`
	Publishers      int     `json:"publishers"`
	Partitions      int     `json:"partitions"`
	DurationSeconds float64 `json:"duration_s"`
	IntervalSeconds float64 `json:"interval_s"`
	// WarmupSeconds: samples taken before this are left out of the trends.
	WarmupSeconds  float64 `json:"warmup_s"`
	KeepForSeconds float64 `json:"keep_for_s"`
	Naptime        string  `json:"autovacuum_naptime"`
	// TableDefaults: the tables ran on PostgreSQL's storage parameters,
	// not those Migrate sets (-soak-table-defaults, for comparison).
	TableDefaults bool `json:"table_defaults,omitempty"`
	// Run holds the whole run's figures (delivered, duplicates, latency).
	Run     *growthRun   `json:"run,omitempty"`
	Samples []soakSample `json:"samples"`
	Trends  []trend      `json:"trends"`
}

// soakSample is the state of the soak at Seconds since its first publish;
// the window figures cover the messages that arrived since the previous
// sample.
type soakSample struct {
	Seconds        float64       `json:"s"`
	Delivered      int64         `json:"delivered"`
	Published      int64         `json:"published"`
	WindowRate     float64       `json:"window_msgs_per_s"`
	P50Ms          float64       `json:"p50_ms"`
	P99Ms          float64       `json:"p99_ms"`
	ProcessMicros  float64       `json:"process_cpu_us_per_msg"`
	PostgresMicros float64       `json:"postgres_cpu_us_per_msg"`
	RSSBytes       int64         `json:"rss_bytes"`
	HeapInuseBytes int64         `json:"heap_inuse_bytes"`
	Goroutines     int           `json:"goroutines"`
	Connections    int           `json:"connections"`
	VacuumDeleted  int64         `json:"vacuum_deleted"`
	Tables         []tableSample `json:"tables"`
	// Statements are the soakStatementsN statements that took the most
	// execution time in the interval (pg_stat_statements, when loaded).
	Statements []windowStatement `json:"statements,omitempty"`
}

// windowStatement is a statement's calls and mean execution time within
// one sample's interval.
type windowStatement struct {
	Query  string  `json:"query"`
	Calls  int64   `json:"calls"`
	MeanMs float64 `json:"mean_ms"`
	// TotalMs is the execution time of its calls in the interval.
	TotalMs float64 `json:"total_ms"`
}

// soakStatementsN is how many statements a soak sample keeps.
const soakStatementsN = 6

// tableSample is one table of the outbox schema (pg_stat_user_tables'
// estimates of live and dead rows; size with indexes and TOAST).
type tableSample struct {
	Name     string `json:"name"`
	LiveRows int64  `json:"live_rows"`
	DeadRows int64  `json:"dead_rows"`
	Bytes    int64  `json:"bytes"`
}

// soakPhase runs the soak.
func (b *bench) soakPhase(ctx context.Context, res *results) error {
	cfg := b.cfg
	perTx := max(1, cfg.soakRate/1000)
	s := &soakResult{
		Rate: cfg.soakRate, PerTx: perTx, Publishers: cfg.latencyPublishers, Partitions: cfg.partitions,
		DurationSeconds: cfg.soakDuration.Seconds(), IntervalSeconds: cfg.soakInterval.Seconds(),
		WarmupSeconds:  soakWarmup(cfg.soakDuration).Seconds(),
		KeepForSeconds: cfg.soakKeepFor.Seconds(), TableDefaults: cfg.soakTableDefaults,
	}
	res.Soak = s
	naptime, err := b.naptime(ctx)
	if err != nil {
		return err
	}
	s.Naptime = naptime
	if !slices.Equal(cfg.phases, []string{phaseSoak}) {
		logf("soak: autovacuum_naptime is %s, the other phases'; run -phases soak alone for -soak-naptime", naptime)
	}
	rec := &soakRecorder{b: b, ctx: ctx, res: s, every: cfg.soakInterval}
	messages := int(float64(cfg.soakRate) * cfg.soakDuration.Seconds())
	r, err := b.runTracked(ctx, trackedSpec{
		label:      fmt.Sprintf("soak at %d msg/s for %v", cfg.soakRate, cfg.soakDuration),
		name:       "soak",
		partitions: cfg.partitions,
		messages:   messages,
		rate:       cfg.soakRate,
		perTx:      perTx,
		publishers: cfg.latencyPublishers,
		vacuum:     true,
		keepFor:    cfg.soakKeepFor,
		prepare: func(ctx context.Context, schema string) error {
			if !cfg.soakTableDefaults {
				return nil
			}
			return b.resetStorageParameters(ctx, schema)
		},
		tick: rec.tick,
		end:  rec.end,
	})
	s.Run = r
	s.Trends = s.trends()
	if err == nil {
		err = rec.err
	}
	for _, t := range s.Trends {
		logf("soak trend: %-34s %10.2f → %10.2f %-6s slope %+10.2f/h  noise %8.2f  %s", t.Metric, t.First, t.Last, t.Unit, t.SlopePerHour, t.Noise, t.Verdict)
	}
	return err
}

// soakWarmup is the start of a soak left out of its trends: the first 10%,
// at most 5 minutes (the caches, the pools and the tables' first pages
// fill then).
func soakWarmup(d time.Duration) time.Duration { return min(d/10, 5*time.Minute) }

// naptime is the server's autovacuum_naptime: -soak-naptime when the soak
// runs alone, else the other phases' 5 s (startCluster).
func (b *bench) naptime(ctx context.Context) (string, error) {
	var v string
	err := b.admin.QueryRow(ctx, "SHOW autovacuum_naptime").Scan(&v)
	return v, err
}

// resetStorageParameters puts schema's tables back on PostgreSQL's
// storage parameters (and so the server's autovacuum settings), undoing
// what Migrate set (0012_churn.sql), for a soak to compare against.
func (b *bench) resetStorageParameters(ctx context.Context, schema string) error {
	rows, err := b.admin.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' AND c.reloptions IS NOT NULL`, schema)
	if err != nil {
		return err
	}
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return err
		}
		tables = append(tables, t)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, t := range tables {
		stmt := "ALTER TABLE " + pgx.Identifier{schema, t}.Sanitize() + ` RESET (fillfactor, autovacuum_vacuum_scale_factor,
			autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay)`
		if _, err := b.admin.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("reset the storage parameters of %s: %w", t, err)
		}
	}
	logf("soak: the tables run on PostgreSQL's storage parameters (%d reset)", len(tables))
	return nil
}

// soakRecorder takes the soak's samples.
type soakRecorder struct {
	b     *bench
	ctx   context.Context
	res   *soakResult
	every time.Duration
	err   error // of the first sample that failed

	prevAt        time.Time
	prevDelivered int64
	prevCPU       cpuSample
	prevStmts     map[int64]stmtTotals // by queryid
}

// stmtTotals are pg_stat_statements' cumulative figures of a statement.
type stmtTotals struct {
	calls   int64
	totalMs float64
}

func (r *soakRecorder) tick(tr *tracked, now time.Time) {
	if r.err != nil {
		return
	}
	if r.prevAt.IsZero() {
		r.prevAt, r.prevCPU = now, readCPU(r.b.postmaster)
		r.prevStmts, _ = r.statementTotals()
		return
	}
	if now.Sub(r.prevAt) >= r.every {
		r.err = r.sample(tr, now)
	}
}

// end takes a last sample when at least half an interval passed since the
// previous one.
func (r *soakRecorder) end(tr *tracked, now time.Time) {
	if r.err == nil && !r.prevAt.IsZero() && now.Sub(r.prevAt) >= r.every/2 {
		r.err = r.sample(tr, now)
	}
}

func (r *soakRecorder) sample(tr *tracked, now time.Time) error {
	cpu := readCPU(r.b.postmaster)
	delivered := tr.cons.received.Load()
	w := tr.cons.takeWindow()
	sortInt64s(w)
	s := soakSample{
		Seconds: now.Sub(tr.t0).Seconds(), Delivered: delivered, Published: tr.load.published.Load(),
		WindowRate: float64(delivered-r.prevDelivered) / max(now.Sub(r.prevAt).Seconds(), 1e-3),
		P50Ms:      ms(percentile(w, 0.5)), P99Ms: ms(percentile(w, 0.99)),
		RSSBytes: currentRSS(), HeapInuseBytes: heapInuse(), Goroutines: runtime.NumGoroutine(),
	}
	if n := delivered - r.prevDelivered; n > 0 {
		s.ProcessMicros = (cpu.process - r.prevCPU.process).Seconds() * 1e6 / float64(n)
		s.PostgresMicros = (cpu.server - r.prevCPU.server).Seconds() * 1e6 / float64(n)
	}
	if tr.vacuum != nil {
		s.VacuumDeleted = tr.vacuum.Stats().Deleted
	}
	if err := r.b.admin.QueryRow(r.ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND backend_type = 'client backend'`).Scan(&s.Connections); err != nil {
		return err
	}
	rows, err := r.b.admin.Query(r.ctx, `SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid)
		FROM pg_stat_user_tables WHERE schemaname = $1 ORDER BY relname`, tr.schema)
	if err != nil {
		return err
	}
	for rows.Next() {
		var t tableSample
		if err := rows.Scan(&t.Name, &t.LiveRows, &t.DeadRows, &t.Bytes); err != nil {
			rows.Close()
			return err
		}
		s.Tables = append(s.Tables, t)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	r.windowStatements(&s)
	r.prevAt, r.prevDelivered, r.prevCPU = now, delivered, cpu
	r.res.Samples = append(r.res.Samples, s)
	pending := tableSample{}
	for _, t := range s.Tables {
		if t.Name == "pending" {
			pending = t
		}
	}
	logf("soak: %6.0f s  %6.0f msg/s  p50 %6.1f ms  p99 %7.1f ms  CPU %5.0f + %5.0f µs/msg  RSS %4d MiB  goroutines %4d  connections %3d  pending %5d live %6d dead %5.1f MiB",
		s.Seconds, s.WindowRate, s.P50Ms, s.P99Ms, s.ProcessMicros, s.PostgresMicros, s.RSSBytes>>20, s.Goroutines, s.Connections,
		pending.LiveRows, pending.DeadRows, float64(pending.Bytes)/(1<<20))
	return nil
}

// statementTotals reads pg_stat_statements' totals of the database and
// the statements' texts (nil without pg_stat_statements).
func (r *soakRecorder) statementTotals() (map[int64]stmtTotals, map[int64]string) {
	if !r.b.pgss {
		return nil, nil
	}
	rows, err := r.b.admin.Query(r.ctx, `SELECT queryid, calls, total_exec_time, query FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query NOT LIKE '%pg_stat_statements%'`)
	if err != nil {
		logf("warning: reading pg_stat_statements: %v", err)
		return nil, nil
	}
	defer rows.Close()
	totals, queries := map[int64]stmtTotals{}, map[int64]string{}
	for rows.Next() {
		var id int64
		var t stmtTotals
		var q string
		if err := rows.Scan(&id, &t.calls, &t.totalMs, &q); err != nil {
			logf("warning: reading pg_stat_statements: %v", err)
			return nil, nil
		}
		totals[id], queries[id] = t, q
	}
	return totals, queries
}

// windowStatements puts into s the statements that took the most time
// since the previous sample.
func (r *soakRecorder) windowStatements(s *soakSample) {
	totals, queries := r.statementTotals()
	if totals == nil {
		return
	}
	for id, t := range totals {
		prev := r.prevStmts[id]
		calls, ms := t.calls-prev.calls, t.totalMs-prev.totalMs
		if calls <= 0 || ms <= 0 {
			continue
		}
		s.Statements = append(s.Statements, windowStatement{Query: squeeze(queries[id], 100), Calls: calls, TotalMs: ms, MeanMs: ms / float64(calls)})
	}
	slices.SortFunc(s.Statements, func(a, b windowStatement) int { return cmp.Compare(b.TotalMs, a.TotalMs) })
	s.Statements = s.Statements[:min(len(s.Statements), soakStatementsN)]
	r.prevStmts = totals
}
