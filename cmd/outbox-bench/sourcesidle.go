package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// What an idle fleet costs, taken apart: the many-sources run measures the
// databases without a fleet first (autovacuum's workers visit every
// database, the checkpointer and the in-process broker idle), then the
// fleet idle: its connections by state and last statement, the statements
// it ran (pg_stat_statements over the sources' databases) and the CPU of
// the server's client backends of those databases apart from the rest.

// connGroup is a group of client connections to the sources' databases:
// those in one state whose last statement starts alike.
type connGroup struct {
	State string `json:"state"`
	Query string `json:"query"`
	Count int    `json:"count"`
}

// sourceStatement is one statement the sources' databases ran, summed over
// the databases.
type sourceStatement struct {
	Query string `json:"query"`
	// CallsPerSecond is per source: the calls over all the databases
	// divided by their number and the window's length.
	CallsPerSecond float64 `json:"calls_per_s_per_source"`
	TotalMs        float64 `json:"total_ms"`
}

// idleBreakdown is what the many-sources run's idle window is made of.
type idleBreakdown struct {
	// NoFleet: CPU ms/s with the databases created and nothing running
	// against them (the floor the fleet's cost adds to).
	NoFleetProcessMillisPerSecond  float64 `json:"no_fleet_process_cpu_ms_per_s"`
	NoFleetPostgresMillisPerSecond float64 `json:"no_fleet_postgres_cpu_ms_per_s"`
	// BackendsMillisPerSecond is the CPU of the server's client backends
	// of the sources' databases that lived through the idle window (the
	// rest of the server's is autovacuum, the checkpointer and the like).
	BackendsMillisPerSecond float64           `json:"backends_cpu_ms_per_s"`
	Connections             []connGroup       `json:"connections"`
	Statements              []sourceStatement `json:"statements"`
	// StatementsPerSecond is per source: every statement of the sources'
	// databases in the window.
	StatementsPerSecond float64 `json:"statements_per_s_per_source"`
}

// sourceBackends returns the pids of the client backends connected to the
// databases named prefix_*.
func (b *bench) sourceBackends(ctx context.Context, prefix string) []int {
	rows, err := b.admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname LIKE $1`, prefix+`\_%`)
	if err != nil {
		logf("warning: reading pg_stat_activity: %v", err)
		return nil
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			out = append(out, pid)
		}
	}
	return out
}

// processCPU returns the CPU time (user + system) of each of pids that
// /proc shows.
func processCPU(pids []int) map[int]time.Duration {
	out := map[int]time.Duration{}
	for _, pid := range pids {
		raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(raw, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(raw[i+1:]))
		if len(f) < 13 {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		out[pid] = time.Duration(utime+stime) * 10 * time.Millisecond
	}
	return out
}

// backendsCPU is the CPU the backends of before spent between the two
// readings, counting those alive at both.
func backendsCPU(before, after map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, t := range after {
		if t0, ok := before[pid]; ok {
			d += t - t0
		}
	}
	return d
}

// sourceConnections groups the client connections to the databases named
// prefix_* by state and the start of their last statement.
func (b *bench) sourceConnections(ctx context.Context, prefix string) []connGroup {
	rows, err := b.admin.Query(ctx, `SELECT coalesce(state, ''), left(regexp_replace(query, '\s+', ' ', 'g'), 70) AS q, count(*)
		FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname LIKE $1
		GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2`, prefix+`\_%`)
	if err != nil {
		logf("warning: reading pg_stat_activity: %v", err)
		return nil
	}
	defer rows.Close()
	var out []connGroup
	for rows.Next() {
		var g connGroup
		if rows.Scan(&g.State, &g.Query, &g.Count) == nil {
			out = append(out, g)
		}
	}
	return out
}

// sourceStatements returns what the databases named prefix_* ran since
// the last resetPGSS, summed over them, the most called first, and every
// statement's calls per second per source.
func (b *bench) sourceStatements(ctx context.Context, prefix string, sources int, window time.Duration) ([]sourceStatement, float64) {
	if !b.pgss {
		return nil, 0
	}
	rows, err := b.admin.Query(ctx, `SELECT query, sum(calls), sum(total_exec_time)
		FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
		WHERE d.datname LIKE $1 AND s.toplevel
		GROUP BY query ORDER BY 2 DESC`, prefix+`\_%`)
	if err != nil {
		logf("warning: reading pg_stat_statements: %v", err)
		return nil, 0
	}
	defer rows.Close()
	per := float64(sources) * window.Seconds()
	var out []sourceStatement
	var all float64
	for rows.Next() {
		var q string
		var calls, ms float64
		if err := rows.Scan(&q, &calls, &ms); err != nil {
			logf("warning: reading pg_stat_statements: %v", err)
			return nil, 0
		}
		all += calls
		if len(out) < 15 {
			out = append(out, sourceStatement{Query: squeeze(q, 120), CallsPerSecond: calls / per, TotalMs: ms})
		}
	}
	return out, all / per
}

// markdown renders the breakdown.
func (d *idleBreakdown) markdown(sb *strings.Builder, sources int, idle float64) {
	fmt.Fprintf(sb, "Idle, taken apart: without the fleet (the databases only) %.1f ms/s (%.1f + %.1f); the fleet's client backends %.1f ms/s of PostgreSQL's; %.2f statements per second per source.\n\n",
		d.NoFleetProcessMillisPerSecond+d.NoFleetPostgresMillisPerSecond, d.NoFleetProcessMillisPerSecond, d.NoFleetPostgresMillisPerSecond,
		d.BackendsMillisPerSecond, d.StatementsPerSecond)
	fmt.Fprintf(sb, "The fleet's own: %.2f ms/s per source (idle minus no fleet, over %d sources).\n\n",
		(idle-d.NoFleetProcessMillisPerSecond-d.NoFleetPostgresMillisPerSecond)/float64(sources), sources)
	if len(d.Connections) > 0 {
		sb.WriteString("| connections | state | last statement |\n|---:|---|---|\n")
		for _, c := range d.Connections {
			fmt.Fprintf(sb, "| %d | %s | `%s` |\n", c.Count, c.State, strings.ReplaceAll(c.Query, "|", `\|`))
		}
		sb.WriteString("\n")
	}
	if len(d.Statements) > 0 {
		sb.WriteString("| calls/s per source | total ms | statement |\n|---:|---:|---|\n")
		for _, s := range d.Statements {
			fmt.Fprintf(sb, "| %.3f | %.1f | `%s` |\n", s.CallsPerSecond, s.TotalMs, strings.ReplaceAll(s.Query, "|", `\|`))
		}
		sb.WriteString("\n")
	}
}
