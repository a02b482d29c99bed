package main

import (
	"context"
	"strings"
	"unicode/utf8"
)

// topStatementsN is how many statements each run keeps, by total time.
const topStatementsN = 8

// statement is one line of pg_stat_statements for a run.
type statement struct {
	// Query is the normalised text, squeezed to one line and cut at about
	// 160 characters.
	Query   string  `json:"query"`
	Calls   int64   `json:"calls"`
	TotalMs float64 `json:"total_ms"`
	MeanMs  float64 `json:"mean_ms"`
	Rows    int64   `json:"rows"`
}

// createPGSS creates the pg_stat_statements extension in the database the
// benchmark uses, and reports whether it can be used.
func (b *bench) createPGSS(ctx context.Context) bool {
	if _, err := b.admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		logf("warning: pg_stat_statements is not available (%v); going on without it", err)
		return false
	}
	return true
}

// resetPGSS empties pg_stat_statements, before a measured run.
func (b *bench) resetPGSS(ctx context.Context) {
	if !b.pgss {
		return
	}
	if _, err := b.admin.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		logf("warning: pg_stat_statements_reset: %v", err)
	}
}

// topStatements returns the statements of this database with the largest
// total execution time since the last resetPGSS (nil without
// pg_stat_statements), leaving out the benchmark's own queries of
// pg_stat_statements. With pg_stat_statements.track = all, a statement run
// inside a function or a CTE counts on its own as well as in the time of
// the statement that ran it.
func (b *bench) topStatements(ctx context.Context) []statement {
	if !b.pgss {
		return nil
	}
	rows, err := b.admin.Query(ctx, `SELECT query, calls, total_exec_time, mean_exec_time, rows
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND query NOT LIKE '%pg_stat_statements%'
		ORDER BY total_exec_time DESC
		LIMIT $1`, topStatementsN)
	if err != nil {
		logf("warning: reading pg_stat_statements: %v", err)
		return nil
	}
	defer rows.Close()
	var out []statement
	for rows.Next() {
		var s statement
		if err := rows.Scan(&s.Query, &s.Calls, &s.TotalMs, &s.MeanMs, &s.Rows); err != nil {
			logf("warning: reading pg_stat_statements: %v", err)
			return nil
		}
		s.Query = squeeze(s.Query, 160)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		logf("warning: reading pg_stat_statements: %v", err)
	}
	return out
}

// squeeze puts s on one line, with single spaces, cut at n characters.
func squeeze(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
