package delivery

import (
	"testing"
	"time"
)

// Retries of many partitions that failed together must not fire together.
func TestBackoffIsJittered(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := jitter(time.Second)
		if d < 500*time.Millisecond || d > time.Second {
			t.Fatalf("jitter(1s) = %v, outside [0.5s, 1s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 900 {
		t.Fatalf("%d distinct delays of 1000: retries would synchronise", len(seen))
	}
}
