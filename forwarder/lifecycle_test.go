package forwarder_test

import (
	"context"
	"errors"
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
