package startstop_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/startstop"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// untilDone is a run that returns nil when its context ends.
func untilDone(ctx context.Context) error { <-ctx.Done(); return nil }

// A second Run while the first runs is ErrAlreadyRunning, naming the
// component; the first goes on, and Close ends it with nil.
func TestRunTwiceIsAlreadyRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &startstop.Service{Name: "test.Thing"}
		done := make(chan error, 1)
		go func() { done <- s.Run(context.Background(), nil, untilDone) }()
		synctest.Wait()
		err := s.Run(context.Background(), nil, untilDone)
		if !errors.Is(err, sentinel.ErrAlreadyRunning) || !strings.Contains(err.Error(), "test.Thing") {
			t.Fatalf("second Run: %v, want ErrAlreadyRunning naming test.Thing", err)
		}
		select {
		case err := <-done:
			t.Fatalf("the first Run returned %v after a second Run was refused", err)
		default:
		}
		s.Close()
		if err := <-done; err != nil {
			t.Fatalf("Run after Close: %v, want nil", err)
		}
	})
}

// A service runs once: after a Run that started returned (its context
// ended, no Close), Run is ErrClosed.
func TestRunAfterItStoppedIsClosed(t *testing.T) {
	s := &startstop.Service{Name: "test.Thing"}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx, nil, untilDone); err != nil {
		t.Fatalf("Run on an ended context: %v", err)
	}
	if err := s.Run(context.Background(), nil, untilDone); !errors.Is(err, sentinel.ErrClosed) {
		t.Fatalf("Run after a Run returned: %v, want ErrClosed", err)
	}
}

// Close before Run: Run is ErrClosed and runs nothing.
func TestCloseBeforeRunMakesRunClosed(t *testing.T) {
	s := &startstop.Service{Name: "test.Thing"}
	s.Close()
	if !s.Closed() {
		t.Fatal("Closed() false after Close")
	}
	called := false
	err := s.Run(context.Background(), func(context.Context) error { called = true; return nil }, untilDone)
	if !errors.Is(err, sentinel.ErrClosed) || called {
		t.Fatalf("Run after Close: %v (start called: %v), want ErrClosed without calling start", err, called)
	}
	if err := s.Start(context.Background(), func(context.Context) { called = true }); !errors.Is(err, sentinel.ErrClosed) || called {
		t.Fatalf("Start after Close: %v (run called: %v), want ErrClosed", err, called)
	}
}

// Close waits for Run to return, and for every goroutine the service
// started with Go, however long they take to finish after the stop.
func TestCloseDuringRunWaitsForRunAndItsGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &startstop.Service{Name: "test.Thing"}
		var runEnded, goroutineEnded atomic.Bool
		done := make(chan error, 1)
		go func() {
			done <- s.Run(context.Background(), nil, func(ctx context.Context) error {
				s.Go(func() {
					<-ctx.Done()
					time.Sleep(3 * time.Second) // a slow goroutine's cleanup
					goroutineEnded.Store(true)
				})
				<-ctx.Done()
				time.Sleep(time.Second) // Run's own cleanup
				runEnded.Store(true)
				return nil
			})
		}()
		synctest.Wait()
		start := time.Now()
		s.Close()
		if !runEnded.Load() || !goroutineEnded.Load() {
			t.Fatalf("Close returned before Run (%v) and its goroutine (%v) ended", runEnded.Load(), goroutineEnded.Load())
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Fatalf("Close waited %v, want 3s (the slower of Run and its goroutine)", waited)
		}
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	})
}

// Run itself returns only after its goroutines, when its context ends.
func TestRunWaitsForItsGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &startstop.Service{}
		ctx, cancel := context.WithCancel(context.Background())
		var ended atomic.Bool
		done := make(chan error, 1)
		go func() {
			done <- s.Run(ctx, nil, func(ctx context.Context) error {
				s.Go(func() { <-ctx.Done(); time.Sleep(time.Second); ended.Store(true) })
				return nil // run returns at once; its goroutine lives on until ctx ends
			})
		}()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("Run returned %v while its goroutine runs", err)
		default:
		}
		// run returned, so the service's context ended: the goroutine stops.
		if err := <-done; err != nil || !ended.Load() {
			t.Fatalf("Run: %v, goroutine ended: %v", err, ended.Load())
		}
		cancel()
	})
}

// Close is idempotent, from any number of goroutines, before and after Run.
func TestCloseTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &startstop.Service{}
		done := make(chan error, 1)
		go func() { done <- s.Run(context.Background(), nil, untilDone) }()
		synctest.Wait()
		closed := make(chan struct{})
		for range 3 {
			go func() { s.Close(); closed <- struct{}{} }()
		}
		for range 3 {
			<-closed
		}
		s.Close()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// A Run whose start failed returns its error and leaves the service as it
// was: the next Run runs. A start that fails because the context ended is
// a stop: Run returns nil, and the service has run.
func TestFailedStartCanRunAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &startstop.Service{Name: "test.Thing"}
		errDown := errors.New("database down")
		var starts atomic.Int32
		start := func(context.Context) error {
			if starts.Add(1) == 1 {
				return errDown
			}
			return nil
		}
		if err := s.Run(context.Background(), start, untilDone); !errors.Is(err, errDown) {
			t.Fatalf("Run with a failing start: %v, want its error", err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Run(context.Background(), start, untilDone) }()
		synctest.Wait()
		s.Close()
		if err := <-done; err != nil || starts.Load() != 2 {
			t.Fatalf("second Run: %v after %d starts, want nil after 2", err, starts.Load())
		}

		s2 := &startstop.Service{}
		ctx, cancel := context.WithCancel(context.Background())
		err := s2.Run(ctx, func(ctx context.Context) error { cancel(); return ctx.Err() }, untilDone)
		if err != nil {
			t.Fatalf("Run whose start failed as its context ended: %v, want nil", err)
		}
		if err := s2.Run(context.Background(), nil, untilDone); !errors.Is(err, sentinel.ErrClosed) {
			t.Fatalf("Run after a Run stopped while starting: %v, want ErrClosed", err)
		}
	})
}

// Close during a start ends the start's context and waits for Run.
func TestCloseDuringStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &startstop.Service{}
		done := make(chan error, 1)
		go func() {
			done <- s.Run(context.Background(), func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, untilDone)
		}()
		synctest.Wait()
		s.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run closed while starting: %v, want nil", err)
			}
		default:
			t.Fatal("Close returned before Run")
		}
	})
}

// Run returns what run returned: an error retrying cannot mend.
func TestRunReturnsRunsError(t *testing.T) {
	s := &startstop.Service{}
	errFatal := errors.New("fatal")
	if err := s.Run(context.Background(), nil, func(context.Context) error { return errFatal }); !errors.Is(err, errFatal) {
		t.Fatalf("Run: %v, want run's error", err)
	}
	if err := s.Run(context.Background(), nil, untilDone); !errors.Is(err, sentinel.ErrClosed) {
		t.Fatalf("Run after a Run that ran: %v, want ErrClosed", err)
	}
}

// Start runs the service in a goroutine of its own, which Close waits for;
// a second Start is ErrAlreadyRunning.
func TestStartRunsInTheBackgroundAndCloseWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &startstop.Service{Name: "test.Listener"}
		var ended atomic.Bool
		if err := s.Start(context.Background(), func(ctx context.Context) {
			<-ctx.Done()
			time.Sleep(time.Second)
			ended.Store(true)
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.Start(context.Background(), func(context.Context) {}); !errors.Is(err, sentinel.ErrAlreadyRunning) {
			t.Fatalf("second Start: %v, want ErrAlreadyRunning", err)
		}
		synctest.Wait()
		s.Close()
		if !ended.Load() {
			t.Fatal("Close returned before the background run ended")
		}
	})
}

// The zero Service works, and its errors name "service".
func TestZeroServiceNamesItself(t *testing.T) {
	var s startstop.Service
	s.Close()
	if err := s.Run(context.Background(), nil, untilDone); !errors.Is(err, sentinel.ErrClosed) || !strings.Contains(err.Error(), "service") {
		t.Fatalf("Run on a closed zero Service: %v", err)
	}
}

// Spawn runs work of a running service from outside it: the goroutine gets
// the service's context, and Close waits for it. Before the service runs,
// and once it was told to stop, Spawn refuses and runs nothing.
func TestSpawnRunsOnlyWhileTheServiceRunsAndCloseWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &startstop.Service{Name: "test.Thing"}
		ran := func(context.Context) { t.Error("Spawn ran fn on a service that does not run") }
		if s.Spawn(ran) {
			t.Fatal("Spawn before Start: true, want false")
		}
		if err := s.Start(context.Background(), func(ctx context.Context) { <-ctx.Done() }); err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		var ended atomic.Bool
		if !s.Spawn(func(ctx context.Context) {
			<-ctx.Done() // the service's context: it ends with Close
			<-release
			ended.Store(true)
		}) {
			t.Fatal("Spawn on a running service: false")
		}
		closed := make(chan struct{})
		go func() { s.Close(); close(closed) }()
		synctest.Wait() // Close ended the context, and waits
		select {
		case <-closed:
			t.Fatal("Close returned while a spawned goroutine runs")
		default:
		}
		if s.Spawn(ran) {
			t.Fatal("Spawn after Close: true, want false")
		}
		close(release)
		<-closed
		if !ended.Load() {
			t.Fatal("Close returned before the spawned goroutine")
		}
		if s.Spawn(ran) {
			t.Fatal("Spawn after the service stopped: true, want false")
		}
	})
}

// A service whose context ended (not closed) refuses Spawn as well: it is
// stopping.
func TestSpawnRefusedOnceTheContextEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &startstop.Service{}
		ctx, cancel := context.WithCancel(context.Background())
		release := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- s.Run(ctx, nil, func(ctx context.Context) error { <-ctx.Done(); <-release; return nil })
		}()
		synctest.Wait()
		cancel()
		synctest.Wait() // run is past ctx.Done, held by release
		if s.Spawn(func(context.Context) { t.Error("spawned after the context ended") }) {
			t.Fatal("Spawn after the Run's context ended: true, want false")
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// Spawn racing Close: each Spawn either refuses or runs a goroutine that
// Close waited for (the race detector checks the WaitGroup's use).
func TestSpawnRacingClose(t *testing.T) {
	for range 50 {
		s := &startstop.Service{}
		if err := s.Start(context.Background(), func(ctx context.Context) { <-ctx.Done() }); err != nil {
			t.Fatal(err)
		}
		var spawned, finished atomic.Int32
		start := make(chan struct{})
		var spawners sync.WaitGroup
		for range 4 {
			spawners.Go(func() {
				<-start
				for range 20 {
					if s.Spawn(func(ctx context.Context) { <-ctx.Done(); finished.Add(1) }) {
						spawned.Add(1)
					}
				}
			})
		}
		close(start)
		s.Close()
		got := finished.Load() // what Close waited for
		spawners.Wait()
		if n := spawned.Load(); got != n {
			t.Fatalf("Close returned with %d of %d spawned goroutines finished", got, n)
		}
	}
}

// Closing is closed by Close, whether asked for before or after it; a
// service that never ran has one too.
func TestClosingIsClosedByClose(t *testing.T) {
	s := &startstop.Service{}
	before := s.Closing()
	select {
	case <-before:
		t.Fatal("Closing closed before Close")
	default:
	}
	if s.Closing() != before {
		t.Fatal("Closing returned another channel")
	}
	s.Close()
	s.Close()
	for _, ch := range []<-chan struct{}{before, s.Closing()} {
		select {
		case <-ch:
		default:
			t.Fatal("Closing not closed after Close")
		}
	}
	closedFirst := &startstop.Service{}
	closedFirst.Close()
	select {
	case <-closedFirst.Closing():
	default:
		t.Fatal("Closing asked for after Close is not closed")
	}
}
