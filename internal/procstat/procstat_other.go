//go:build !linux

// Package procstat reads CPU time of this process and of a local PostgreSQL
// server from /proc, for the benchmarks.
package procstat

import "time"

// CPU is not available without /proc: ok is false.
func CPU(int) (server, client time.Duration, ok bool) { return 0, 0, false }

// PostmasterOf is not available without /proc: it returns 0.
func PostmasterOf(int) int { return 0 }
