package outbox_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Close waits for every background goroutine of the Subscriber: each
// subscription's, the notification listener's, the sequencer's and the
// workers' Tasks. Each in turn is held, once Close told it to stop, by the
// test's hook: Close must not return until the test lets it go.
func TestSubscriberCloseWaitsForEachBackgroundGoroutine(t *testing.T) {
	// Not parallel: goleak sees every goroutine of the process.
	e := newEnv(t)
	e.Register("life", 2)
	leakOpts := goleak.IgnoreCurrent()
	for _, held := range []string{"subscription", "listener", "sequencer", "tasks"} {
		t.Run(held, func(t *testing.T) {
			sub := newSub(t, e, "life-"+held, nil)
			reached, release := make(chan struct{}), make(chan struct{})
			outbox.SetExitHook(sub, func(what string) {
				if what == held {
					close(reached)
					<-release
				}
			})
			msgs, err := sub.Subscribe(context.Background(), "life")
			if err != nil {
				t.Fatal(err)
			}
			closed := make(chan struct{})
			go func() {
				if err := sub.Close(); err != nil {
					t.Error(err)
				}
				close(closed)
			}()
			<-reached // Close told it to stop; it is held in the hook
			select {
			case <-closed:
				t.Fatalf("Close returned while the %s goroutine runs", held)
			default:
			}
			close(release)
			<-closed
			// Close returned: the subscription's channel was closed before.
			select {
			case _, open := <-msgs:
				if open {
					t.Fatal("a message arrived after Close")
				}
			default:
				t.Fatal("Close returned before the subscription's channel was closed")
			}
			if err := sub.Close(); err != nil { // idempotent
				t.Fatal(err)
			}
			if _, err := sub.Subscribe(context.Background(), "life"); !errors.Is(err, outbox.ErrClosed) {
				t.Fatalf("Subscribe after Close: %v, want ErrClosed", err)
			}
		})
	}
	goleak.VerifyNone(t, leakOpts)
}

// A Close that begins while a Subscribe prepares (reads the topic's
// incarnation, held up here by a lock the test holds on the topics table)
// waits for it; that Subscribe then succeeds with a channel closed before
// Close returns, and nothing is left running.
func TestSubscriberCloseDuringSubscribeWaitsForIt(t *testing.T) {
	// Not parallel: goleak sees every goroutine of the process.
	e := newEnv(t)
	e.Register("life", 1)
	leakOpts := goleak.IgnoreCurrent()
	sub := newSub(t, e, "life-concurrent", nil)
	closing := make(chan struct{})
	outbox.SetExitHook(sub, func(what string) {
		if what == "tasks" { // the Subscriber's own goroutine: Close began
			close(closing)
		}
	})
	first, err := sub.Subscribe(context.Background(), "life")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+e.Schema+".topics IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	var second <-chan *message.Message
	subscribed := make(chan error, 1)
	go func() {
		var err error
		second, err = sub.Subscribe(context.Background(), "life")
		subscribed <- err
	}()
	outboxtest.WaitFor(t, "the second Subscribe to wait for the lock", time.Minute, func() bool {
		return e.Int(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND position($1 in query) > 0 AND position('FROM created_at' in query) > 0`, e.Schema) > 0
	})
	closed := make(chan struct{})
	go func() { _ = sub.Close(); close(closed) }()
	<-closing
	select {
	case <-closed:
		t.Fatal("Close returned while a Subscribe prepares")
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	<-closed
	if err := <-subscribed; err != nil {
		t.Fatalf("the Subscribe Close waited for: %v", err)
	}
	for _, msgs := range []<-chan *message.Message{first, second} {
		select {
		case _, open := <-msgs:
			if open {
				t.Fatal("a message arrived after Close")
			}
		default:
			t.Fatal("Close returned before a subscription's channel was closed")
		}
	}
	goleak.VerifyNone(t, leakOpts)
}

// The Subscriber keeps no lifecycle of its own: no context cancelled by
// Close, no WaitGroup (internal/startstop's Service runs it).
func TestSubscriberHasNoHandRolledLifecycle(t *testing.T) {
	lifecycle := map[reflect.Type]bool{
		reflect.TypeFor[context.Context]():    true,
		reflect.TypeFor[context.CancelFunc](): true,
		reflect.TypeFor[sync.WaitGroup]():     true,
		reflect.TypeFor[*sync.WaitGroup]():    true,
	}
	typ := reflect.TypeFor[outbox.Subscriber]()
	for i := range typ.NumField() {
		if f := typ.Field(i); lifecycle[f.Type] {
			t.Errorf("Subscriber.%s is a %v", f.Name, f.Type)
		}
	}
}
