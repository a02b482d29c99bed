package console_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// The overview says how many messages of a topic are delayed, when the
// next one is due, and how many later messages of their keys wait behind
// them.
func TestOverviewShowsDelayedMessages(t *testing.T) {
	f := consoletest.New(t, false)
	m := outboxtest.Keyed("reminder", "customer-7", 1, "x")
	due := time.Now().Add(time.Hour)
	if err := outbox.DeliverAt(m, due); err != nil {
		t.Fatal(err)
	}
	// Two later orders of the same customer wait behind it; one of another
	// customer, and one marked Unordered, do not.
	unordered := outboxtest.Keyed("cancel", "customer-7", 1, "x")
	if err := outbox.Unordered(unordered); err != nil {
		t.Fatal(err)
	}
	f.B.Publish("orders", m, outboxtest.Keyed("o2", "customer-7", 1, "x"), outboxtest.Keyed("o3", "customer-7", 1, "x"),
		outboxtest.Keyed("other", "customer-8", 1, "x"), unordered)
	code, body := f.Get(t, "/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d", code)
	}
	if !strings.Contains(body, `<span class="delayed">1 delayed, next due at `) ||
		!strings.Contains(body, `<span class="behind-delayed">2 more wait behind them</span>`) {
		t.Fatalf("the overview does not show the delayed message and the 2 behind it:\n%s", body)
	}
}
