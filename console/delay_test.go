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

// The overview says how many messages of a topic are delayed, and when the
// next one is due.
func TestOverviewShowsDelayedMessages(t *testing.T) {
	f := consoletest.New(t, false)
	m := outboxtest.Keyed("reminder", "customer-7", 1, "x")
	due := time.Now().Add(time.Hour)
	if err := outbox.DeliverAt(m, due); err != nil {
		t.Fatal(err)
	}
	f.B.Publish("orders", m)
	code, body := f.Get(t, "/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d", code)
	}
	if !strings.Contains(body, `<span class="delayed">1 delayed, next due at `) {
		t.Fatalf("the overview does not show the delayed message:\n%s", body)
	}
}
