// Package startstop is the one lifecycle of the outbox's long-running
// components: outbox.Sequencer, relay.Relay, retention.Vacuum, the
// notifier's shared listener and the lease manager each embed a [Service]
// and implement Run and Close in a few lines on it (River's
// rivershared/startstop is the model). Components without a Run of their
// own start one (Start) and hand it their goroutines ([Service.Spawn]):
// outbox.Subscriber, the workers' consumer.Tasks, the Kafka target.
//
// The rules, the same for every component:
//
//   - Run runs once. It blocks until its context ends or Close is called,
//     and returns nil then; it returns an error only for what retrying
//     cannot mend (each component lists them). Transient errors are
//     retried inside Run with the shared backoff (internal/backoff).
//   - A second Run while the first runs returns an error matching
//     sentinel.ErrAlreadyRunning (outbox.ErrAlreadyRunning); a Run after the
//     service stopped (Close was called, or a Run that started returned)
//     returns an error matching sentinel.ErrClosed (outbox.ErrClosed). Create
//     another component to run again.
//   - A Run whose start failed (it returned the start's error: a schema
//     that was never migrated, a database that cannot be reached) leaves the
//     service as it was: Run may be called again, e.g. after outbox.Migrate
//     or with a retry loop.
//   - Close is idempotent and safe before, during and after Run, from any
//     goroutine but the service's own: it stops Run and waits until Run
//     and every goroutine the service started ([Service.Go],
//     [Service.Spawn]) have returned.
package startstop

import (
	"context"
	"fmt"
	"sync"

	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// Service is the lifecycle state of one component. Embed it (a field, not
// a pointer) and set Name in the constructor; the zero value is usable. It
// must not be copied after first use.
type Service struct {
	// Name names the component in errors, e.g. "outbox.Sequencer".
	Name string

	mu       sync.Mutex
	running  bool            // a Run (or Start) is under way
	stopping bool            // the Run under way is waiting for its goroutines: Spawn refuses
	ended    bool            // a Run that started has returned: the service ran
	closed   bool            // Close was called
	closing  chan struct{}   // closed by Close (made by Closing)
	ctx      context.Context // the Run under way's (Spawn hands it on)
	cancel   context.CancelFunc

	active     sync.WaitGroup // the Run under way
	goroutines sync.WaitGroup // goroutines started with Go
}

// Run runs the service once: it calls start (when not nil), then run,
// both with a context that ends when ctx ends or Close is called, and
// returns what run returned, once every goroutine started with Go has
// returned too.
//
// When start fails, Run returns its error and leaves the service as it
// was, so that Run may be called again; when start fails because that
// context ended, Run returns nil and the service has stopped. A second Run
// while one is under way returns an error matching sentinel.ErrAlreadyRunning,
// a Run after Close or after a Run that started returned an error matching
// sentinel.ErrClosed.
func (s *Service) Run(ctx context.Context, start, run func(context.Context) error) error {
	ctx, cancel, err := s.claim(ctx)
	if err != nil {
		return err
	}
	return s.execute(ctx, cancel, start, run)
}

// Start is Run in a goroutine of its own, for a service nobody waits on
// (the notifier's listener): it claims the service as Run does, returning
// the same errors, then runs run in a new goroutine that Close waits for.
func (s *Service) Start(ctx context.Context, run func(context.Context)) error {
	ctx, cancel, err := s.claim(ctx)
	if err != nil {
		return err
	}
	go func() {
		_ = s.execute(ctx, cancel, nil, func(ctx context.Context) error { run(ctx); return nil })
	}()
	return nil
}

// Go runs fn in a goroutine of the service: Run returns, and Close
// returns, only after fn has. Call it only from start or run (their
// context is fn's to watch), or from a goroutine of the service; from
// anywhere else, use Spawn.
func (s *Service) Go(fn func()) {
	s.goroutines.Go(fn)
}

// Spawn runs fn in a goroutine of the service, with the service's context
// (the one start and run get): Run returns, and Close returns, only after
// fn has. Unlike Go it may be called from any goroutine, at any time: it
// returns false, and runs nothing, unless the service is running and has
// not been told to stop (before Run or Start, once Close was called or
// the context of Run ended, it refuses). A component whose methods start
// work of their own on a running service (a Subscribe) spawns it.
func (s *Service) Spawn(fn func(ctx context.Context)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running || s.stopping || s.ctx.Err() != nil {
		return false
	}
	// Added with mu held and stopping false: before execute's Wait, which
	// starts only once it set stopping under mu.
	ctx := s.ctx
	s.goroutines.Go(func() { fn(ctx) })
	return true
}

// Close stops the service and waits: it ends the context of the Run under
// way and returns once that Run, and every goroutine it started with Go,
// has returned. A Run called after Close returns sentinel.ErrClosed. Close may
// be called any number of times, before, during or after Run, but not from
// the service's own goroutines (it would wait for itself).
func (s *Service) Close() {
	s.mu.Lock()
	if !s.closed && s.closing != nil {
		close(s.closing)
	}
	s.closed = true
	cancel := s.cancel
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	s.active.Wait()
}

// Closed reports whether Close was called.
func (s *Service) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Closing returns a channel that is closed when Close is called (at once
// if it was): for the callers of a component's methods, which are not
// goroutines of the service and have no context of it, to stop waiting
// when the component closes.
func (s *Service) Closing() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing == nil {
		s.closing = make(chan struct{})
		if s.closed {
			close(s.closing)
		}
	}
	return s.closing
}

// claim makes the service running, or says why it cannot run.
func (s *Service) claim(ctx context.Context) (context.Context, context.CancelFunc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, nil, fmt.Errorf("%w: %s.Run after Close: a %s runs once; create another", sentinel.ErrClosed, s.name(), s.name())
	case s.running:
		return nil, nil, fmt.Errorf("%w: %s.Run called while it runs", sentinel.ErrAlreadyRunning, s.name())
	case s.ended:
		return nil, nil, fmt.Errorf("%w: %s.Run after it stopped: a %s runs once; create another", sentinel.ErrClosed, s.name(), s.name())
	}
	s.running = true
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.active.Add(1) // (never after Close set closed, so never during its Wait)
	return s.ctx, s.cancel, nil
}

// execute runs start and run on the claimed ctx, then releases the claim.
func (s *Service) execute(ctx context.Context, cancel context.CancelFunc, start, run func(context.Context) error) (err error) {
	ran := false
	defer func() {
		s.mu.Lock()
		s.stopping = true // no Spawn from now on: none adds during the Wait
		s.mu.Unlock()
		cancel()
		s.goroutines.Wait()
		s.mu.Lock()
		s.running, s.stopping, s.ctx, s.cancel = false, false, nil, nil
		s.ended = s.ended || ran
		s.mu.Unlock()
		s.active.Done()
	}()
	if start != nil {
		if err := start(ctx); err != nil {
			if ctx.Err() != nil {
				ran = true // stopped while starting: that was its run
				return nil
			}
			return err
		}
	}
	ran = true
	return run(ctx)
}

func (s *Service) name() string {
	if s.Name == "" {
		return "service"
	}
	return s.Name
}
