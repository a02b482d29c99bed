package main

import (
	"strings"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// outbox status says how many messages of a topic are delayed and when the
// next is due.
func TestStatusShowsDelayedMessages(t *testing.T) {
	b := outboxtest.Setup(t)
	b.Register("reminders", 1)
	m := outboxtest.Keyed("r1", "customer-7", 1, "x")
	due := time.Now().Add(time.Hour)
	if err := outbox.DeliverAt(m, due); err != nil {
		t.Fatal(err)
	}
	b.Publish("reminders", m, outboxtest.Keyed("r2", "customer-7", 1, "x"), outboxtest.Keyed("r3", "customer-8", 1, "x"))
	out := newCLI(t, b.Schema).ok("status")
	if want := "(1 delayed, next due at " + due.Format(time.RFC3339) + "; 1 more wait behind them in their keys' order)"; !strings.Contains(out, want) {
		t.Fatalf("status does not say %q:\n%s", want, out)
	}
}
