package consumer

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// Stop ends the tasks' context and returns only once every task has
// returned, however long a task takes after its context ended.
func TestTasksStopWaitsForEveryTask(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := NewTasks()
		if err := tasks.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		stopSeen := make(chan struct{})
		tasks.Go(func(ctx context.Context) {
			<-ctx.Done()
			close(stopSeen)
			<-release // the task's cleanup, blocked by the test
		})
		stopped := make(chan struct{})
		go func() { tasks.Stop(); close(stopped) }()
		<-stopSeen
		synctest.Wait() // everything that can run has run: Stop waits
		select {
		case <-stopped:
			t.Fatal("Stop returned while a task runs")
		default:
		}
		close(release)
		<-stopped
	})
}

// Before Start, and after Stop, a task runs at once in the caller's
// goroutine with a context that has ended: nothing is left running.
func TestTasksGoOutsideTheirLifeRunsAtOnceStopped(t *testing.T) {
	tasks := NewTasks()
	goNow := func(when string) {
		t.Helper()
		ran := false
		tasks.Go(func(ctx context.Context) {
			ran = true
			if ctx.Err() == nil {
				t.Errorf("%s: the task's context has not ended", when)
			}
		})
		if !ran {
			t.Fatalf("%s: Go returned before the task ran", when)
		}
	}
	goNow("before Start")
	if err := tasks.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	tasks.Stop()
	goNow("after Stop")
	if err := tasks.Start(context.Background()); !errors.Is(err, sentinel.ErrClosed) {
		t.Fatalf("Start after Stop: %v, want ErrClosed", err)
	}
}

// A second Start while they run is ErrAlreadyRunning; Stop is idempotent.
func TestTasksStartTwiceAndStopTwice(t *testing.T) {
	tasks := NewTasks()
	if err := tasks.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := tasks.Start(context.Background()); !errors.Is(err, sentinel.ErrAlreadyRunning) {
		t.Fatalf("second Start: %v, want ErrAlreadyRunning", err)
	}
	tasks.Stop()
	tasks.Stop()
}

// The context given to Start ends the tasks too (Stop still waits for
// them).
func TestTasksEndWithStartsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := NewTasks()
		ctx, cancel := context.WithCancel(context.Background())
		if err := tasks.Start(ctx); err != nil {
			t.Fatal(err)
		}
		ended := make(chan struct{})
		tasks.Go(func(ctx context.Context) { <-ctx.Done(); close(ended) })
		cancel()
		<-ended
		tasks.Stop()
	})
}

// A nil *Tasks (workers stepped without a Subscriber's, as the simulator
// steps them) runs a task in a goroutine of its own whose context never
// ends.
func TestNilTasksRunTasksThatAreNeverStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tasks *Tasks
		answered := make(chan struct{})
		done := make(chan error, 1)
		tasks.Go(func(ctx context.Context) {
			select {
			case <-answered:
				done <- ctx.Err()
			case <-ctx.Done():
				done <- errors.New("the context of a nil Tasks' task ended")
			}
		})
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("the task returned before it was answered: %v", err)
		default:
		}
		close(answered)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// A Marker whose Tasks have stopped (its Subscriber closed) refuses marks
// at once, starting nothing.
func TestMarkerOfStoppedTasksRefusesMarks(t *testing.T) {
	tasks := NewTasks()
	if err := tasks.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	tasks.Stop()
	m := newMarker(nil, "outbox", "g", tasks)
	ok, err := m.mark(context.Background(), "orders", newFakeLease(newFakeStore("a")), 1)
	if ok || !errors.Is(err, errMarkerStopped) {
		t.Fatalf("mark after the Tasks stopped: %v, %v; want false, errMarkerStopped", ok, err)
	}
}

// The workers' Config carries no lifecycle of its own: no context to stop
// on, no WaitGroup to count goroutines in (the Stop and Background fields
// went; Tasks, started and stopped by the Subscriber, took their place).
func TestConfigCarriesNoLifecycle(t *testing.T) {
	lifecycle := map[reflect.Type]bool{
		reflect.TypeFor[context.Context]():    true,
		reflect.TypeFor[context.CancelFunc](): true,
		reflect.TypeFor[sync.WaitGroup]():     true,
		reflect.TypeFor[*sync.WaitGroup]():    true,
		reflect.TypeFor[<-chan struct{}]():    true,
		reflect.TypeFor[chan struct{}]():      true,
	}
	config := reflect.TypeFor[Config]()
	for i := range config.NumField() {
		f := config.Field(i)
		if lifecycle[f.Type] {
			t.Errorf("Config.%s is a %v: a worker's lifecycle comes from the Subscriber's Tasks", f.Name, f.Type)
		}
	}
	for _, gone := range []string{"Stop", "Background"} {
		if _, ok := config.FieldByName(gone); ok {
			t.Errorf("Config.%s is back", gone)
		}
	}
	if f, ok := config.FieldByName("Tasks"); !ok || f.Type != reflect.TypeFor[*Tasks]() {
		t.Errorf("Config.Tasks: %v, %v; want a *Tasks", f.Type, ok)
	}
}
