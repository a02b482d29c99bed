package tune

import (
	"math"
	"testing"
	"time"
)

func TestModeCountersSaturate(t *testing.T) {
	m, err := NewMode(ModeConfig{BatchSize: 10, DegradeAfter: 1, BackoffBase: time.Second, BackoffMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m.failures = math.MaxInt
	m.Failed(0)
	if m.ConsecutiveFailures() != math.MaxInt {
		t.Fatalf("failures overflowed to %d", m.ConsecutiveFailures())
	}
	if got := m.Backoff(); got != time.Hour {
		t.Fatalf("Backoff with MaxInt failures = %v, want the 1h cap", got)
	}
	m.successes = math.MaxInt
	m.Succeeded()
	if m.ConsecutiveSuccesses() != math.MaxInt {
		t.Fatalf("successes overflowed to %d", m.ConsecutiveSuccesses())
	}
}

func TestModeDoublingDoesNotOverflow(t *testing.T) {
	m, err := NewMode(ModeConfig{BatchSize: math.MaxInt, DegradeAfter: 1, BackoffBase: time.Second, BackoffMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	half := math.MaxInt/2 + 1
	m.Failed(half)
	if m.State() != Degraded || m.BatchSize() != half {
		t.Fatalf("got %v/%d, want degraded/%d", m.State(), m.BatchSize(), half)
	}
	m.Succeeded() // 2·half overflows int; must saturate at the configured size
	if m.State() != Normal || m.BatchSize() != math.MaxInt {
		t.Fatalf("got %v/%d, want normal/MaxInt", m.State(), m.BatchSize())
	}
}
