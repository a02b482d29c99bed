package tune

import (
	"math"
	"time"
)

// ExponentialBackoff returns the delay before retrying after failures
// consecutive failures: base when failures is zero (or negative), otherwise
// base·2^(failures-1) capped at max. It never overflows, however large
// failures is. A non-positive base yields zero for any failure count.
func ExponentialBackoff(base, max time.Duration, failures int) time.Duration {
	if failures <= 0 {
		return base
	}
	if base <= 0 {
		return 0
	}
	d := base
	// Each doubling brings d closer to max; once there, or once another
	// doubling would overflow, stop. At most 62 iterations for d >= 1ns.
	for i := 1; i < failures && d < max; i++ {
		if d > math.MaxInt64/2 {
			d = math.MaxInt64
			break
		}
		d *= 2
	}
	if d > max {
		return max
	}
	return d
}
