package console_test

import (
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Every value is escaped: the hostile uuid, payload, metadata and reason
// appear as text on the list and detail pages, never as markup.
func TestEveryValueIsEscaped(t *testing.T) {
	f := consoletest.New(t, false)
	for _, path := range []string{"/dlq", "/dlq/" + consoletest.Itoa(f.Entry), "/"} {
		code, body := f.Get(t, path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", path, code)
		}
		if strings.Contains(body, "<script>window") || strings.Contains(body, "<img src=x") {
			t.Fatalf("GET %s renders the hostile value as markup", path)
		}
	}
	_, body := f.Get(t, "/dlq/"+consoletest.Itoa(f.Entry))
	if !strings.Contains(body, "&lt;script&gt;window.__pwned=1&lt;/script&gt;") {
		t.Fatal("the payload is not shown as escaped text")
	}
	resp, err := f.Client.Get(f.Server.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Fatalf("Content-Security-Policy %q", csp)
	}
}

// Read-only by default; with actions on, an action needs the token and a
// CSRF token from this console and its origin; then it works.
func TestActionsAreRefusedUnlessEnabledAuthenticatedAndFromTheConsole(t *testing.T) {
	ro := consoletest.New(t, false)
	form := url.Values{"id": {consoletest.Itoa(ro.Entry)}, "csrf": {"read-only pages carry none"}}
	if resp := ro.Post(t, "/actions/discard", form, map[string]string{"Authorization": "Bearer " + ro.Token}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("read-only console: action answered %d, want 403", resp.StatusCode)
	}
	if _, err := console.New(console.Config{Pool: ro.B.Pool, EnableActions: true}, nil); err == nil || !strings.Contains(err.Error(), "Token") {
		t.Fatalf("actions without authentication accepted: %v", err)
	}

	f := consoletest.New(t, true)
	csrf := f.CSRF(t)
	auth := map[string]string{"Authorization": "Bearer " + f.Token}
	for name, tc := range map[string]struct {
		form   url.Values
		header map[string]string
		want   int
	}{
		"no token":     {url.Values{"id": {consoletest.Itoa(f.Entry)}, "csrf": {csrf}, "confirm": {"yes"}}, nil, http.StatusUnauthorized},
		"wrong token":  {url.Values{"id": {consoletest.Itoa(f.Entry)}, "csrf": {csrf}, "confirm": {"yes"}}, map[string]string{"Authorization": "Bearer nope"}, http.StatusUnauthorized},
		"no csrf":      {url.Values{"id": {consoletest.Itoa(f.Entry)}, "confirm": {"yes"}}, auth, http.StatusForbidden},
		"other origin": {url.Values{"id": {consoletest.Itoa(f.Entry)}, "csrf": {csrf}, "confirm": {"yes"}}, map[string]string{"Authorization": "Bearer " + f.Token, "Origin": "https://evil.example"}, http.StatusForbidden},
		"wrong csrf":   {url.Values{"id": {consoletest.Itoa(f.Entry)}, "csrf": {strings.Repeat("0", 64)}, "confirm": {"yes"}}, auth, http.StatusForbidden},
	} {
		if resp := f.Post(t, "/actions/discard", tc.form, tc.header); resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", name, resp.StatusCode, tc.want)
		}
	}
	if n := f.B.Int("SELECT count(*) FROM " + f.B.Schema + ".dead_letters WHERE status = 'pending'"); n != 1 {
		t.Fatal("a refused action changed the entry")
	}
	if resp := f.Post(t, "/actions/discard", url.Values{"id": {consoletest.Itoa(f.Entry)}, "csrf": {csrf}}, auth); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("an action without confirm=yes: %d, want 400", resp.StatusCode)
	}
	resp := f.Post(t, "/actions/discard", url.Values{"id": {consoletest.Itoa(f.Entry)}, "csrf": {csrf}, "confirm": {"yes"}, "back": {"/dlq"}}, auth)
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/dlq?flash=") {
		t.Fatalf("authorized discard: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if n := f.B.Int("SELECT count(*) FROM " + f.B.Schema + ".dead_letters WHERE status = 'discarded'"); n != 1 {
		t.Fatal("the authorized discard did not happen")
	}
	// Basic auth with the token as password works too; an open redirect
	// through "back" does not.
	resp = f.Post(t, "/actions/pause", url.Values{"group": {"nobody"}, "topic": {"orders"}, "csrf": {csrf}, "confirm": {"yes"}, "back": {"//evil.example/x"}},
		map[string]string{"Authorization": "Basic " + basic("ops", f.Token)})
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("pause of an unknown group with basic auth: %d, want 404", resp.StatusCode)
	}
}

func basic(user, pw string) string {
	req, _ := http.NewRequest(http.MethodGet, "http://x", nil)
	req.SetBasicAuth(user, pw)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}

// Characters a page would not show as themselves (escape sequences,
// bidirectional overrides, zero-width characters) are shown as escapes on
// every page, so that "bil\u200bling" does not pass for "billing".
func TestHiddenCharactersAreShownAsEscapes(t *testing.T) {
	f := consoletest.New(t, true)
	id := consoletest.Itoa(f.AddDeadLetter(t, outboxtype.RejectedMessage{Group: "bil\u200bling", Topic: "orders", UUID: "u\u2066id",
		PartitionKey: "abc\u202edef", Payload: []byte("{\"a\":\"x\u202ey\"}\n"), Metadata: map[string]string{"k\u202e": "v\u200b"},
		Reason: errors.New("\x1b]0;owned\a\x1b[2J failed")}))
	for _, path := range []string{"/dlq/" + id, "/dlq", "/confirm/retry-held?group=bil%E2%80%8Bling&topic=orders&partition=0&key=abc%E2%80%AEdef"} {
		_, page := f.Get(t, path)
		body := page
		// The forms carry the exact values, as they must to act on them.
		body = regexp.MustCompile(`<input type="hidden"[^>]*>`).ReplaceAllString(body, "")
		if strings.ContainsAny(body, "\u200b\u202e\u2066\x1b\a") {
			t.Errorf("GET %s shows a hidden character as itself", path)
		}
		if !strings.Contains(page, `bil\u200bling`) {
			t.Errorf("GET %s does not show the group's zero-width space as an escape", path)
		}
	}
	_, page := f.Get(t, "/dlq/"+id)
	for _, want := range []string{`abc\u202edef`, `u\u2066id`, `k\u202e`, `v\u200b`, `x\u202ey`, `\x1b]0;owned\x07\x1b[2J failed`} {
		if !strings.Contains(page, want) {
			t.Errorf("the dead-letter page does not show %q", want)
		}
	}
	if _, body := f.Get(t, "/dlq/"+id+"/payload"); body != "{\"a\":\"x\u202ey\"}\n" {
		t.Errorf("the download is not the exact payload: %q", body)
	}
}
