package tune_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/tune"
)

// newMode returns a Mode with the given batch size and degradation threshold
// and the backoff used by the reference tests (100 ms up to 30 s).
func newMode(t *testing.T, batchSize, degradeAfter int) *tune.Mode {
	t.Helper()
	m, err := tune.NewMode(tune.ModeConfig{
		BatchSize:    batchSize,
		DegradeAfter: degradeAfter,
		BackoffBase:  100 * time.Millisecond,
		BackoffMax:   30 * time.Second,
	})
	if err != nil {
		t.Fatalf("NewMode: %v", err)
	}
	return m
}

// degraded returns a Mode (threshold 1) already in Degraded state with the
// given effective batch size. A rejection sets the size exactly.
func degraded(t *testing.T, batchSize, effective int) *tune.Mode {
	t.Helper()
	m := newMode(t, batchSize, 1)
	m.Rejected(effective)
	requireState(t, m, tune.Degraded, effective)
	return m
}

func requireState(t *testing.T, m *tune.Mode, state tune.State, size int) {
	t.Helper()
	if m.State() != state || m.BatchSize() != size {
		t.Fatalf("got %v with batch size %d, want %v with batch size %d", m.State(), m.BatchSize(), state, size)
	}
}

func TestModeNormalUsesConfiguredSize(t *testing.T) {
	m := newMode(t, 50, 1)
	requireState(t, m, tune.Normal, 50)
	if m.ConsecutiveFailures() != 0 || m.ConsecutiveSuccesses() != 0 {
		t.Fatalf("fresh mode has counters %d/%d", m.ConsecutiveFailures(), m.ConsecutiveSuccesses())
	}
}

func TestModeDegradedUsesEffectiveSize(t *testing.T) {
	m := degraded(t, 50, 4)
	if got := m.BatchSize(); got != 4 {
		t.Fatalf("BatchSize = %d, want 4", got)
	}
	if got := m.Config().BatchSize; got != 50 {
		t.Fatalf("configured BatchSize = %d, want 50", got)
	}
}

func TestModeRetryWithUnknownCountDegradesToOne(t *testing.T) {
	m := newMode(t, 50, 1)
	m.Failed(0)
	requireState(t, m, tune.Degraded, 1)
	if m.ConsecutiveSuccesses() != 0 {
		t.Fatalf("successes = %d, want 0", m.ConsecutiveSuccesses())
	}
}

func TestModeSuccessRampsUp(t *testing.T) {
	m := degraded(t, 50, 1)
	for i, want := range []int{2, 4, 8, 16, 32} {
		m.Succeeded()
		requireState(t, m, tune.Degraded, want)
		if m.ConsecutiveSuccesses() != i+1 {
			t.Fatalf("after %d successes ConsecutiveSuccesses = %d", i+1, m.ConsecutiveSuccesses())
		}
	}
	m.Succeeded() // 64 is capped at 50: back to normal
	requireState(t, m, tune.Normal, 50)
}

func TestModeRampsUpToNormal(t *testing.T) {
	m := degraded(t, 32, 16)
	m.Succeeded() // 16 -> 32 reaches the configured size
	requireState(t, m, tune.Normal, 32)
}

func TestModeRejectInNormalDegrades(t *testing.T) {
	m := newMode(t, 50, 1)
	m.Rejected(0)
	requireState(t, m, tune.Degraded, 1)
}

func TestModeRejectWithProcessedCount(t *testing.T) {
	m := newMode(t, 50, 1)
	m.Rejected(3) // three messages went through before the poison one
	requireState(t, m, tune.Degraded, 3)
}

func TestModeRetryWithProcessedCountZero(t *testing.T) {
	m := newMode(t, 50, 1)
	m.Failed(0) // failed at the very first message
	requireState(t, m, tune.Degraded, 1)
}

func TestModeRetryWithProcessedCount(t *testing.T) {
	m := newMode(t, 50, 1)
	m.Failed(7)
	requireState(t, m, tune.Degraded, 7)
}

func TestModeSuccessInNormalStaysNormal(t *testing.T) {
	m := newMode(t, 50, 1)
	m.Succeeded()
	requireState(t, m, tune.Normal, 50)
}

func TestModeFullRecoveryCycle(t *testing.T) {
	m := newMode(t, 8, 1)
	m.Failed(0)
	requireState(t, m, tune.Degraded, 1)
	m.Succeeded()
	requireState(t, m, tune.Degraded, 2)
	m.Succeeded()
	requireState(t, m, tune.Degraded, 4)
	m.Succeeded()
	requireState(t, m, tune.Normal, 8)
}

func TestModeDoesNotDegradeBelowThreshold(t *testing.T) {
	m := newMode(t, 50, 3)
	m.Failed(0)
	requireState(t, m, tune.Normal, 50)
	if m.ConsecutiveFailures() != 1 {
		t.Fatalf("failures = %d, want 1", m.ConsecutiveFailures())
	}
	m.Failed(0)
	requireState(t, m, tune.Normal, 50)
	if m.ConsecutiveFailures() != 2 {
		t.Fatalf("failures = %d, want 2", m.ConsecutiveFailures())
	}
	m.Failed(0) // third failure reaches the threshold
	requireState(t, m, tune.Degraded, 1)
	if m.ConsecutiveFailures() != 3 {
		t.Fatalf("failures = %d, want 3", m.ConsecutiveFailures())
	}
}

func TestModeThresholdUsesCountOfDegradingFailure(t *testing.T) {
	m := newMode(t, 50, 2)
	m.Failed(9) // below threshold: ignored for sizing
	requireState(t, m, tune.Normal, 50)
	m.Failed(5)
	requireState(t, m, tune.Degraded, 5)
	m.Failed(2) // every failure past the threshold re-degrades
	requireState(t, m, tune.Degraded, 2)
}

func TestModeFailureBelowThresholdKeepsDegradedSize(t *testing.T) {
	m := newMode(t, 64, 2)
	m.Failed(0)
	m.Failed(4)
	requireState(t, m, tune.Degraded, 4)
	m.Succeeded()
	requireState(t, m, tune.Degraded, 8)
	m.Failed(1) // one failure again: below the threshold, size unchanged
	requireState(t, m, tune.Degraded, 8)
	if m.ConsecutiveSuccesses() != 0 {
		t.Fatalf("a failure must reset ConsecutiveSuccesses, got %d", m.ConsecutiveSuccesses())
	}
}

func TestModeProcessedCountIsClampedToCurrentBatch(t *testing.T) {
	m := newMode(t, 50, 1)
	m.Failed(500)
	requireState(t, m, tune.Degraded, 50)
	m.Rejected(3)
	m.Failed(10) // cannot have processed more than the 3 it read
	requireState(t, m, tune.Degraded, 3)
	m.Failed(-4)
	requireState(t, m, tune.Degraded, 1)
}

func TestModeDegradedAtFullSizeReturnsToNormalOnSuccess(t *testing.T) {
	m := newMode(t, 10, 1)
	m.Failed(10) // all handled, yet the batch failed as a whole
	requireState(t, m, tune.Degraded, 10)
	m.Succeeded()
	requireState(t, m, tune.Normal, 10)
}

func TestModeSuccessResetsConsecutiveFailures(t *testing.T) {
	m := newMode(t, 50, 3)
	m.Failed(0)
	if m.ConsecutiveFailures() != 1 {
		t.Fatalf("failures = %d, want 1", m.ConsecutiveFailures())
	}
	m.Succeeded()
	if m.ConsecutiveFailures() != 0 {
		t.Fatalf("failures = %d, want 0", m.ConsecutiveFailures())
	}
}

func TestModeRejectClearsFailuresAndBackoff(t *testing.T) {
	m := newMode(t, 50, 5)
	m.Failed(0)
	m.Failed(0)
	if got := m.Backoff(); got != 200*time.Millisecond {
		t.Fatalf("Backoff after 2 failures = %v, want 200ms", got)
	}
	m.Rejected(2)
	requireState(t, m, tune.Degraded, 2)
	if m.ConsecutiveFailures() != 0 {
		t.Fatalf("failures = %d, want 0", m.ConsecutiveFailures())
	}
	if got := m.Backoff(); got != 100*time.Millisecond {
		t.Fatalf("Backoff after reject = %v, want base 100ms", got)
	}
}

func TestModeBackoffNoFailuresReturnsBase(t *testing.T) {
	m := newMode(t, 50, 1)
	if got := m.Backoff(); got != 100*time.Millisecond {
		t.Fatalf("Backoff = %v, want 100ms", got)
	}
}

func TestModeBackoffEscalatesExponentially(t *testing.T) {
	m := newMode(t, 50, 1)
	for _, want := range []time.Duration{100, 200, 400, 800, 1600} {
		m.Failed(0)
		if got := m.Backoff(); got != want*time.Millisecond {
			t.Fatalf("after %d failures Backoff = %v, want %v", m.ConsecutiveFailures(), got, want*time.Millisecond)
		}
	}
}

func TestModeBackoffCapsAtMax(t *testing.T) {
	m, err := tune.NewMode(tune.ModeConfig{
		BatchSize: 50, DegradeAfter: 1,
		BackoffBase: 100 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		m.Failed(0)
	}
	if got := m.Backoff(); got != 500*time.Millisecond {
		t.Fatalf("Backoff after 10 failures = %v, want 500ms", got)
	}
}

func TestModeStatus(t *testing.T) {
	m := newMode(t, 20, 1)
	m.Failed(3)
	m.Succeeded()
	want := tune.Status{
		State: tune.Degraded, BatchSize: 6, ConfiguredBatchSize: 20,
		ConsecutiveFailures: 0, ConsecutiveSuccesses: 1,
	}
	if got := m.Status(); got != want {
		t.Fatalf("Status = %+v, want %+v", got, want)
	}
	b, err := json.Marshal(m.Status())
	if err != nil {
		t.Fatal(err)
	}
	const wantJSON = `{"state":"degraded","batch_size":6,"configured_batch_size":20,"consecutive_failures":0,"consecutive_successes":1}`
	if string(b) != wantJSON {
		t.Fatalf("JSON = %s, want %s", b, wantJSON)
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[tune.State]string{
		tune.Normal: "normal", tune.Degraded: "degraded", tune.State(7): "State(7)",
	} {
		if got := s.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(s), got, want)
		}
	}
}

func TestNewModeRejectsInvalidConfig(t *testing.T) {
	valid := tune.ModeConfig{BatchSize: 10, DegradeAfter: 1, BackoffBase: time.Second, BackoffMax: time.Second}
	tests := []struct {
		name   string
		mutate func(*tune.ModeConfig)
		field  string
	}{
		{"zero batch", func(c *tune.ModeConfig) { c.BatchSize = 0 }, "BatchSize"},
		{"negative batch", func(c *tune.ModeConfig) { c.BatchSize = -1 }, "BatchSize"},
		{"zero threshold", func(c *tune.ModeConfig) { c.DegradeAfter = 0 }, "DegradeAfter"},
		{"zero base", func(c *tune.ModeConfig) { c.BackoffBase = 0 }, "BackoffBase"},
		{"negative base", func(c *tune.ModeConfig) { c.BackoffBase = -time.Second }, "BackoffBase"},
		{"max below base", func(c *tune.ModeConfig) { c.BackoffMax = time.Millisecond }, "BackoffMax"},
	}
	if _, err := tune.NewMode(valid); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.mutate(&cfg)
			m, err := tune.NewMode(cfg)
			if m != nil {
				t.Fatal("NewMode returned a Mode for an invalid config")
			}
			requireConfigError(t, err, tt.field)
		})
	}
}

func requireConfigError(t *testing.T, err error, field string) {
	t.Helper()
	if !errors.Is(err, tune.ErrInvalidConfig) {
		t.Fatalf("error %v does not match ErrInvalidConfig", err)
	}
	var ce *tune.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is not a *ConfigError", err)
	}
	if ce.Field != field {
		t.Fatalf("ConfigError.Field = %q, want %q (error: %v)", ce.Field, field, err)
	}
	if ce.Reason == "" {
		t.Fatal("ConfigError.Reason is empty")
	}
}
