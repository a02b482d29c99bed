package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/worker"
)

// harness runs a worker inside a synctest bubble and records when each
// Execute call started, relative to the bubble's start.
type harness struct {
	t      *testing.T
	origin time.Time
	cancel context.CancelFunc
	done   chan error

	mu       sync.Mutex
	starts   []time.Duration
	failures []worker.Failure
}

func newHarness(t *testing.T) *harness {
	return &harness{t: t, origin: time.Now()}
}

// elapsed returns the virtual time since the harness was created.
func (h *harness) elapsed() time.Duration { return time.Since(h.origin) }

// mark records the start of a call and returns its 0-based index.
func (h *harness) mark() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.starts = append(h.starts, h.elapsed())
	return len(h.starts) - 1
}

func (h *harness) onFailure(f worker.Failure) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures = append(h.failures, f)
}

// start runs worker.Run in a goroutine with a cancellable context. If cfg has
// no OnFailure hook the harness records failures.
func (h *harness) start(cfg worker.Config, action worker.Action) {
	if cfg.OnFailure == nil {
		cfg.OnFailure = h.onFailure
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- worker.Run(ctx, cfg, action) }()
}

// stop cancels the worker, requires Run to return nil without any virtual
// time passing, and returns the recorded call start times.
func (h *harness) stop() []time.Duration {
	h.t.Helper()
	at := h.elapsed()
	h.cancel()
	if err := <-h.done; err != nil {
		h.t.Fatalf("Run returned %v, want nil after cancellation", err)
	}
	if took := h.elapsed() - at; took != 0 {
		h.t.Fatalf("Run took %v of virtual time to stop, want 0", took)
	}
	return h.calls()
}

func (h *harness) calls() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Duration(nil), h.starts...)
}

func (h *harness) recordedFailures() []worker.Failure {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]worker.Failure(nil), h.failures...)
}

func requireStarts(t *testing.T, got []time.Duration, want ...time.Duration) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("calls started at %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("calls started at %v, want %v", got, want)
		}
	}
}

// step is one scripted answer of an action.
type step struct {
	dir  worker.Directive
	err  error
	work time.Duration // simulated work before answering
}

// scripted returns an action that records each call and answers the i-th
// call with steps[i] (and every call after the last step with the last step).
func scripted(h *harness, steps ...step) worker.Action {
	return worker.ActionFunc(func(ctx context.Context) (worker.Directive, error) {
		i := h.mark()
		s := steps[min(i, len(steps)-1)]
		if s.work > 0 {
			time.Sleep(s.work)
		}
		return s.dir, s.err
	})
}
