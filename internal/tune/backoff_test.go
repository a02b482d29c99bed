package tune_test

import (
	"math"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/tune"
)

func TestExponentialBackoff(t *testing.T) {
	const (
		ms = time.Millisecond
		s  = time.Second
	)
	tests := []struct {
		name      string
		base, max time.Duration
		failures  int
		want      time.Duration
	}{
		{"no failures returns base", 100 * ms, 30 * s, 0, 100 * ms},
		{"negative failures returns base", 100 * ms, 30 * s, -3, 100 * ms},
		{"first failure", 100 * ms, 30 * s, 1, 100 * ms},
		{"second failure doubles", 100 * ms, 30 * s, 2, 200 * ms},
		{"third failure", 100 * ms, 30 * s, 3, 400 * ms},
		{"caps at max", 100 * ms, 500 * ms, 10, 500 * ms},
		{"exactly max", 100 * ms, 400 * ms, 3, 400 * ms},
		{"huge base, last doubling that fits", 10 * s, math.MaxInt64, 30, 10 * s << 29},
		{"huge base, doubling would overflow", 10 * s, math.MaxInt64, 31, math.MaxInt64},
		{"count beyond int64 doublings", time.Nanosecond, math.MaxInt64, 200, math.MaxInt64},
		{"max int failures", s, time.Hour, math.MaxInt, time.Hour},
		{"max int failures, no cap", s, math.MaxInt64, math.MaxInt, math.MaxInt64},
		{"zero base", 0, time.Hour, 5, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tune.ExponentialBackoff(tt.base, tt.max, tt.failures); got != tt.want {
				t.Fatalf("ExponentialBackoff(%v, %v, %d) = %v, want %v", tt.base, tt.max, tt.failures, got, tt.want)
			}
		})
	}
}

func TestExponentialBackoffIsMonotonic(t *testing.T) {
	prev := time.Duration(0)
	for n := 1; n < 200; n++ {
		got := tune.ExponentialBackoff(3*time.Millisecond, 90*time.Minute, n)
		if got < prev || got > 90*time.Minute || got <= 0 {
			t.Fatalf("failures=%d: %v after %v", n, got, prev)
		}
		prev = got
	}
}
