package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// The group page lists the held keys (escaped) and, with actions on,
// retries or dead-letters one after confirmation.
func TestHeldKeysAreShownAndActedOn(t *testing.T) {
	f := consoletest.New(t, true)
	key := "cust-" + consoletest.Hostile
	f.B.Publish("orders", outboxtest.Keyed("h1", key, 1, "x"), outboxtest.Keyed("h2", key, 2, "x"))
	store, err := deadletter.NewStore(deadletter.Config{Schema: f.B.Schema, Pool: f.B.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.B.HoldingConsumer("billing", "orders", store, key)
	outboxtest.WaitFor(t, "the key held", 30*time.Second, func() bool { return f.B.Rows("held") == 2 })
	part := consoletest.Itoa(f.B.Int("SELECT partition FROM " + f.B.Schema + ".held LIMIT 1"))
	code, body := f.Get(t, "/groups/orders/billing")
	if code != http.StatusOK || !strings.Contains(body, `id="held"`) || !strings.Contains(body, "1 keys held") {
		t.Fatalf("group page (%d) does not list the held key:\n%s", code, body)
	}
	if strings.Contains(body, "<script>window") || !strings.Contains(body, "cust-&lt;script&gt;") {
		t.Fatal("the held key is not shown as escaped text")
	}
	_, confirm := f.Get(t, "/confirm/dead-letter-held?group=billing&topic=orders&partition="+part+"&key="+url.QueryEscape(key))
	if !strings.Contains(confirm, "as dead letters") || strings.Contains(confirm, "<script>window") {
		t.Fatalf("confirmation page:\n%s", confirm)
	}
	csrf := f.CSRF(t)
	auth := map[string]string{"Authorization": "Bearer " + f.Token}
	form := url.Values{"group": {"billing"}, "topic": {"orders"}, "partition": {part}, "key": {key}, "csrf": {csrf}, "confirm": {"yes"}, "back": {"/groups/orders/billing"}}
	if resp := f.Post(t, "/actions/retry-held", url.Values{"group": {"billing"}, "topic": {"orders"}, "partition": {part}, "key": {key}, "confirm": {"yes"}}, auth); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("retry-held without CSRF: %d, want 403", resp.StatusCode)
	}
	if resp := f.Post(t, "/actions/retry-held", form, auth); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("retry-held: %d", resp.StatusCode)
	}
	if resp := f.Post(t, "/actions/dead-letter-held", form, auth); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("dead-letter-held: %d", resp.StatusCode)
	}
	outboxtest.WaitFor(t, "the key dead-lettered", 30*time.Second, func() bool {
		return f.B.Rows("held") == 0 && f.B.Int("SELECT count(*) FROM "+f.B.Schema+".dead_letters WHERE group_name = 'billing' AND uuid IN ('h1', 'h2')") == 2
	})
	form.Set("key", "nobody")
	if resp := f.Post(t, "/actions/retry-held", form, auth); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("retry-held of a key not held: %d, want 404", resp.StatusCode)
	}
}

// A held key as long as the Publisher's default metadata limit allows can
// be acted on from the console: its form is within the console's bound.
func TestALongHeldKeyCanBeActedOn(t *testing.T) {
	f := consoletest.New(t, true)
	key := strings.Repeat("é", 30_000) // 60 KB, 180 KB percent-encoded
	form := url.Values{"group": {"billing"}, "topic": {"orders"}, "partition": {"0"}, "key": {key}, "csrf": {f.CSRF(t)}, "confirm": {"yes"}}
	if resp := f.Post(t, "/actions/retry-held", form, map[string]string{"Authorization": "Bearer " + f.Token}); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("retry-held of a long key that is not held: %d, want 404", resp.StatusCode)
	}
	form.Set("key", strings.Repeat("x", 1<<20+100_000)) // past the bound by less than the server reads to drain
	if resp := f.Post(t, "/actions/retry-held", form, map[string]string{"Authorization": "Bearer " + f.Token}); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("an action with a 1.1 MB form: %d, want 413", resp.StatusCode)
	}
}
