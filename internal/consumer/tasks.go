package consumer

import (
	"context"

	"github.com/millrace/watermill-outbox/internal/startstop"
)

// Tasks runs the goroutines that the workers of one Subscriber leave
// behind a turn: the Marker's writer, and the waits for a handler a worker
// stopped waiting for (its place in the delivery gate, the rollback of its
// transaction). Its lifecycle is every long-running component's
// (internal/startstop): Start, then Stop, which ends the tasks' context and
// returns once every task has returned. The Subscriber starts its Tasks
// before its first worker and stops them when it closes. Make one with
// NewTasks.
type Tasks struct {
	life startstop.Service
}

// NewTasks returns Tasks that are not started.
func NewTasks() *Tasks {
	t := &Tasks{}
	t.life.Name = "consumer.Tasks"
	return t
}

// Start lets Go run tasks in goroutines of their own until Stop is called
// or ctx ends. A second Start is outbox.ErrAlreadyRunning, a Start
// after Stop outbox.ErrClosed.
func (t *Tasks) Start(ctx context.Context) error {
	return t.life.Start(ctx, func(ctx context.Context) { <-ctx.Done() })
}

// Stop ends the context of every task and returns once they all have
// returned. It is idempotent; before Start, it makes Start fail.
func (t *Tasks) Stop() { t.life.Close() }

// Go runs task in a goroutine that Stop waits for; task's context ends
// when Stop is called (or Start's context ends). Before Start, and once
// that context ended, task runs at once in the caller's goroutine with a
// context that has ended: what it would wait for, it does not wait for.
//
// On a nil *Tasks, task runs in a goroutine of its own whose context never
// ends, which nothing waits for: for workers stepped by a caller that
// owns no Tasks (the simulator, whose abandoned handlers all answer).
func (t *Tasks) Go(task func(ctx context.Context)) {
	if t == nil {
		go task(context.Background())
		return
	}
	if !t.life.Spawn(task) {
		task(stoppedCtx)
	}
}

// stoppedCtx is the context of a task run once its Tasks stopped.
var stoppedCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
