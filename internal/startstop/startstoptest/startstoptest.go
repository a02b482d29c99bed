// Package startstoptest checks that a long-running component has the one
// lifecycle of internal/startstop: Run once, Close waits, Close is
// idempotent. Test support: library packages never import it.
package startstoptest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// Component is what a long-running component exposes.
type Component interface {
	Run(ctx context.Context) error
	Close() error
}

// RunTwiceThenClose runs c twice at once and checks that one Run returns
// ErrAlreadyRunning, that Close (called twice) returns only after the
// other Run returned nil, and that a Run after that is ErrClosed.
func RunTwiceThenClose(t *testing.T, c Component) {
	t.Helper()
	results := make(chan error, 2)
	for range 2 {
		go func() { results <- c.Run(context.Background()) }()
	}
	select {
	case err := <-results:
		if !errors.Is(err, sentinel.ErrAlreadyRunning) {
			t.Fatalf("one of two Runs: %v, want ErrAlreadyRunning", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("neither of two Runs returned ErrAlreadyRunning")
	}
	for range 2 {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-results:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	default:
		t.Fatal("Close returned before Run")
	}
	if err := c.Run(context.Background()); !errors.Is(err, sentinel.ErrClosed) {
		t.Fatalf("Run after it stopped: %v, want ErrClosed", err)
	}
}

// CloseThenRun closes a component that never ran and checks that Run is
// then ErrClosed.
func CloseThenRun(t *testing.T, c Component) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, sentinel.ErrClosed) {
		t.Fatalf("Run after Close: %v, want ErrClosed", err)
	}
}
