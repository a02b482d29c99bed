package tune

import (
	"fmt"
	"math"
	"time"
)

// State is the batch-sizing state of a [Mode].
type State int

const (
	// Normal reads the configured batch size.
	Normal State = iota
	// Degraded reads a reduced batch size after failures or a rejection,
	// doubling it back after each successful batch.
	Degraded
)

// String returns "normal" or "degraded".
func (s State) String() string {
	switch s {
	case Normal:
		return "normal"
	case Degraded:
		return "degraded"
	default:
		return fmt.Sprintf("State(%d)", int(s))
	}
}

// MarshalText encodes the state as its String form, so JSON status output
// reads "normal" or "degraded".
func (s State) MarshalText() ([]byte, error) {
	return []byte(s.String()), nil
}

// ModeConfig configures a [Mode]. [Tuning.ModeConfig] derives one from a
// tuning profile.
type ModeConfig struct {
	// BatchSize is the number of messages read per batch in Normal state.
	// Must be >= 1.
	BatchSize int
	// DegradeAfter is how many consecutive failed batches switch the mode to
	// Degraded. 1 degrades on the first failure. Must be >= 1.
	DegradeAfter int
	// BackoffBase is the retry delay after the first failure. Must be > 0.
	BackoffBase time.Duration
	// BackoffMax caps the exponentially growing retry delay. Must be
	// >= BackoffBase.
	BackoffMax time.Duration
}

// Validate returns nil if c is usable, and otherwise a [*ConfigError]
// describing the first problem found.
func (c ModeConfig) Validate() error {
	if c.BatchSize < 1 {
		return configErrorf("BatchSize", "must be >= 1, got %d", c.BatchSize)
	}
	if c.DegradeAfter < 1 {
		return configErrorf("DegradeAfter", "must be >= 1, got %d", c.DegradeAfter)
	}
	if c.BackoffBase <= 0 {
		return configErrorf("BackoffBase", "must be > 0, got %v", c.BackoffBase)
	}
	if c.BackoffMax < c.BackoffBase {
		return configErrorf("BackoffMax", "must be >= BackoffBase (%v), got %v", c.BackoffBase, c.BackoffMax)
	}
	return nil
}

// Mode is the adaptive batch-size state machine of one partition worker.
//
// Report the outcome of every batch with exactly one of [Mode.Succeeded],
// [Mode.Failed] or [Mode.Rejected], then read [Mode.BatchSize] for the next
// batch and, after a failure, [Mode.Backoff] for how long to wait.
//
// A Mode is not safe for concurrent use.
type Mode struct {
	cfg       ModeConfig
	state     State
	effective int // batch size while Degraded
	failures  int
	successes int
}

// NewMode returns a Mode in Normal state, or a [*ConfigError] if cfg is
// invalid.
func NewMode(cfg ModeConfig) (*Mode, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Mode{cfg: cfg, state: Normal, effective: cfg.BatchSize}, nil
}

// Config returns the configuration the Mode was created with.
func (m *Mode) Config() ModeConfig { return m.cfg }

// State returns the current state.
func (m *Mode) State() State { return m.state }

// BatchSize returns how many messages the next batch should read: the
// configured size in Normal state, the reduced size in Degraded state.
func (m *Mode) BatchSize() int {
	if m.state == Normal {
		return m.cfg.BatchSize
	}
	return m.effective
}

// ConsecutiveFailures returns the number of failed batches since the last
// success or rejection.
func (m *Mode) ConsecutiveFailures() int { return m.failures }

// ConsecutiveSuccesses returns the number of successful batches since the
// last failure or rejection. It is informational only; batch sizing does not
// depend on it.
func (m *Mode) ConsecutiveSuccesses() int { return m.successes }

// Backoff returns how long to wait before retrying: BackoffBase when there
// have been no failures, otherwise BackoffBase·2^(failures-1) capped at
// BackoffMax.
func (m *Mode) Backoff() time.Duration {
	return ExponentialBackoff(m.cfg.BackoffBase, m.cfg.BackoffMax, m.failures)
}

// Succeeded records a batch whose messages were all handled. It clears the
// failure count and, in Degraded state, doubles the batch size; once the
// doubled size reaches the configured size the mode returns to Normal.
func (m *Mode) Succeeded() {
	m.failures = 0
	m.successes = saturatingInc(m.successes)
	if m.state == Normal {
		return
	}
	next := m.effective
	if next > m.cfg.BatchSize/2 {
		next = m.cfg.BatchSize // doubling would reach the target (or overflow)
	} else {
		next *= 2
	}
	if next >= m.cfg.BatchSize {
		m.state = Normal
		m.effective = m.cfg.BatchSize
		return
	}
	m.effective = next
}

// Failed records a batch that failed with a retryable error after processed
// of its messages had been handled successfully (0 if none or unknown). Once
// DegradeAfter consecutive failures have accumulated, this and every further
// failure set the batch size to processed, clamped to [1, current batch
// size]. The caller should wait [Mode.Backoff] before retrying.
func (m *Mode) Failed(processed int) {
	m.failures = saturatingInc(m.failures)
	m.successes = 0
	if m.failures >= m.cfg.DegradeAfter {
		m.degrade(processed)
	}
}

// Rejected records a batch that stopped at a message rejected for good (and
// dead-lettered) after processed messages had been handled successfully.
// Since the partition can move past the message there is nothing to back off
// from: the failure count is cleared. The batch size is reduced at once to
// processed, clamped to [1, current batch size], to isolate any further
// poison messages.
func (m *Mode) Rejected(processed int) {
	m.failures = 0
	m.successes = 0
	m.degrade(processed)
}

func (m *Mode) degrade(processed int) {
	size := min(max(processed, 1), m.BatchSize())
	m.state = Degraded
	m.effective = size
}

// Status is a snapshot of a [Mode], safe to pass between goroutines.
type Status struct {
	// State is the batch-sizing state.
	State State `json:"state"`
	// BatchSize is the batch size the next batch will use.
	BatchSize int `json:"batch_size"`
	// ConfiguredBatchSize is the batch size used in Normal state.
	ConfiguredBatchSize int `json:"configured_batch_size"`
	// ConsecutiveFailures is the number of failed batches in a row.
	ConsecutiveFailures int `json:"consecutive_failures"`
	// ConsecutiveSuccesses is the number of successful batches in a row.
	ConsecutiveSuccesses int `json:"consecutive_successes"`
}

// Status returns a snapshot of the current state.
func (m *Mode) Status() Status {
	return Status{
		State:                m.state,
		BatchSize:            m.BatchSize(),
		ConfiguredBatchSize:  m.cfg.BatchSize,
		ConsecutiveFailures:  m.failures,
		ConsecutiveSuccesses: m.successes,
	}
}

func saturatingInc(n int) int {
	if n == math.MaxInt {
		return n
	}
	return n + 1
}
