package forwarder_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// The Forwarder has the lifecycle of the outbox's long-running components:
// Run once (a second Run while it runs is ErrAlreadyRunning, a Run after
// it stopped is ErrClosed), and Close waits until Run has returned.
func TestForwarderRunsOnceAndCloseWaits(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 1)
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool},
		Topics:     []string{"orders"},
		Target: forwarder.TargetFunc(func(_ context.Context, _ string, batch []*message.Message) (int, error) {
			return len(batch), nil
		}),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- fwd.Run(context.Background()) }()
	outboxtest.WaitFor(t, "the forwarder to join the group", 10*time.Second, func() bool {
		return e.Int("SELECT count(*) FROM "+e.Schema+".members") > 0
	})
	if err := fwd.Run(context.Background()); !errors.Is(err, outbox.ErrAlreadyRunning) {
		t.Fatalf("a second Run: %v, want ErrAlreadyRunning", err)
	}
	if err := fwd.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run returned %v after Close", err)
		}
	default:
		t.Fatal("Close returned before Run did")
	}
	if err := fwd.Run(context.Background()); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Run after Close: %v, want ErrClosed", err)
	}
	if err := fwd.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
}

// Shutting down is cancelling Run's context (or calling Close): a send in
// flight gets the Subscriber's CloseTimeout to finish. Finished within
// it, its messages count as forwarded and the next start does not send
// them again; still running after it, the send's context is cancelled,
// and the next start sends its messages again (exactly once into Kafka
// still holds there: the target's tail read skips what did reach the
// broker). Neither case depends on the machine's speed: the send that
// finishes within CloseTimeout ends 200 ms after the shutdown began with
// a CloseTimeout of a minute, the one that outlasts it never ends by
// itself.
func TestShutdownGivesTheSendInFlightCloseTimeout(t *testing.T) {
	for _, c := range []struct {
		name         string
		closeTimeout time.Duration
		sendTook     time.Duration // how long the send in flight takes after the shutdown began (0: until cancelled)
		resent       bool          // whether the next start sends the batch again
	}{
		{"finishes within CloseTimeout", time.Minute, 200 * time.Millisecond, false},
		{"outlasts CloseTimeout", time.Second, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := fwdtest.NewEnv(t)
			e.Register("orders", 1)
			pub := fwdtest.NewPublisher(t, e)
			pub.Round("orders", 3, nil)

			inFlight := make(chan struct{})
			shutdownBegan := make(chan struct{})
			var cancelled atomic.Pointer[error] // the send's context error, when it was cancelled
			target := forwarder.TargetFunc(func(ctx context.Context, _ string, batch []*message.Message) (int, error) {
				close(inFlight)
				var done <-chan time.Time // never, unless the send takes sendTook
				if c.sendTook > 0 {
					<-shutdownBegan
					done = time.After(c.sendTook)
				}
				select {
				case <-done:
					return len(batch), nil
				case <-ctx.Done():
					err := ctx.Err()
					cancelled.Store(&err)
					return 0, err
				}
			})
			fwd, err := forwarder.NewForwarder(forwarder.Config{
				Subscriber: outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, CloseTimeout: c.closeTimeout},
				Topics:     []string{"orders"},
				Target:     target,
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, shutdown := context.WithCancel(context.Background()) // what signal.NotifyContext does on SIGTERM
			ran := make(chan error, 1)
			go func() { ran <- fwd.Run(ctx) }()
			<-inFlight
			began := time.Now()
			shutdown()
			close(shutdownBegan)
			select {
			case err := <-ran:
				if err != nil {
					t.Fatalf("Run returned %v after its context ended", err)
				}
			case <-time.After(c.closeTimeout + 30*time.Second):
				t.Fatal("Run did not return after its context ended")
			}
			took := time.Since(began)
			var sendErr error
			if p := cancelled.Load(); p != nil {
				sendErr = *p
			}
			if c.resent && (sendErr == nil || took < c.closeTimeout) {
				t.Fatalf("the send outlasting CloseTimeout: its context error %v after %v, want it cancelled after %v", sendErr, took, c.closeTimeout)
			}
			if !c.resent && sendErr != nil {
				t.Fatalf("the send finishing within CloseTimeout was cancelled: %v", sendErr)
			}
			_ = fwd.Close()

			// The next start: what does it send?
			var again fwdtest.Received
			fwdtest.StartForwarder(t, e, nil, forwarder.TargetFunc(func(_ context.Context, _ string, batch []*message.Message) (int, error) {
				for _, m := range batch {
					again.Add(m, 0)
				}
				return len(batch), nil
			}), []string{"orders"}, nil)
			pub.Round("orders", 1, nil) // a marker: once it is through, so is anything before it
			outboxtest.WaitFor(t, "the next start to forward the marker", 30*time.Second, func() bool {
				for _, m := range again.Messages() {
					if m.N == 2 {
						return true
					}
				}
				return false
			})
			if got, want := again.Total(), map[bool]int{false: 1, true: 4}[c.resent]; got != want {
				t.Fatalf("the next start sent %d message(s), want %d (resent: %v)", got, want, c.resent)
			}
		})
	}
}
