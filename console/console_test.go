package console_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const hostile = `<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">`

// fixture: a migrated schema with a topic, a group and a hostile dead
// letter, and a console server on it.
type fixture struct {
	b       *outboxtest.Bundle
	srv     *httptest.Server
	console *console.Console
	prefix  string
	entry   int64
	token   string
	actOn   bool
	client  *http.Client
}

func newFixture(t *testing.T, enableActions bool) *fixture {
	t.Helper()
	return newFixtureWith(t, enableActions, "", nil)
}

// newFixtureWith mounts the console under prefix (with http.StripPrefix,
// as an application does) after edit changed its configuration.
func newFixtureWith(t *testing.T, enableActions bool, prefix string, edit func(*console.Config)) *fixture {
	t.Helper()
	b := outboxtest.Setup(t)
	b.Register("orders", 2)
	store, err := deadletter.NewStore(deadletter.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Add(context.Background(), outbox.RejectedMessage{Group: "billing", Topic: "orders", UUID: "evil-" + hostile,
		Payload: []byte(hostile), Metadata: map[string]string{"note": hostile}, Reason: hostileErr{}}); err != nil {
		t.Fatal(err)
	}
	page, err := store.List(context.Background(), deadletter.ListOptions{})
	if err != nil || len(page.Entries) != 1 {
		t.Fatalf("dead letter: %v %v", page, err)
	}
	f := &fixture{b: b, entry: page.Entries[0].ID, token: "s3cret-token", actOn: enableActions,
		client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	cfg := console.Config{Pool: b.Pool, Schema: b.Schema, EnableActions: enableActions, Token: f.token, Prefix: prefix}
	if edit != nil {
		edit(&cfg)
	}
	c, err := console.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.console, f.prefix = c, prefix
	var h http.Handler = c
	if prefix != "" {
		mux := http.NewServeMux()
		mux.Handle(prefix+"/", http.StripPrefix(prefix, c))
		h = mux
	}
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	return f
}

type hostileErr struct{}

func (hostileErr) Error() string { return "reason " + hostile }

func (f *fixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := f.client.Get(f.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func (f *fixture) csrf(t *testing.T) string {
	t.Helper()
	_, body := f.get(t, f.prefix+"/confirm/discard?id="+itoa(f.entry))
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token on the page")
	}
	return m[1]
}

// addDeadLetter stores a pending dead letter and returns its id.
func (f *fixture) addDeadLetter(t *testing.T, m outbox.RejectedMessage) int64 {
	t.Helper()
	store, err := deadletter.NewStore(deadletter.Config{Schema: f.b.Schema, Pool: f.b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Group == "" {
		m.Group, m.Topic = "billing", "orders"
	}
	if m.UUID == "" {
		m.UUID = watermill.NewUUID()
	}
	if _, err := store.Add(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return f.b.Int("SELECT max(id) FROM " + f.b.Schema + ".dead_letters")
}

func (f *fixture) post(t *testing.T, path string, form url.Values, header map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// Every value is escaped: the hostile uuid, payload, metadata and reason
// appear as text on the list and detail pages, never as markup.
func TestEveryValueIsEscaped(t *testing.T) {
	f := newFixture(t, false)
	for _, path := range []string{"/dlq", "/dlq/" + itoa(f.entry), "/"} {
		code, body := f.get(t, path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", path, code)
		}
		if strings.Contains(body, "<script>window") || strings.Contains(body, "<img src=x") {
			t.Fatalf("GET %s renders the hostile value as markup", path)
		}
	}
	_, body := f.get(t, "/dlq/"+itoa(f.entry))
	if !strings.Contains(body, "&lt;script&gt;window.__pwned=1&lt;/script&gt;") {
		t.Fatal("the payload is not shown as escaped text")
	}
	resp, err := f.client.Get(f.srv.URL + "/")
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
	ro := newFixture(t, false)
	form := url.Values{"id": {itoa(ro.entry)}, "csrf": {"read-only pages carry none"}}
	if resp := ro.post(t, "/actions/discard", form, map[string]string{"Authorization": "Bearer " + ro.token}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("read-only console: action answered %d, want 403", resp.StatusCode)
	}
	if _, err := console.New(console.Config{Pool: ro.b.Pool, EnableActions: true}, nil); err == nil || !strings.Contains(err.Error(), "Token") {
		t.Fatalf("actions without authentication accepted: %v", err)
	}

	f := newFixture(t, true)
	csrf := f.csrf(t)
	auth := map[string]string{"Authorization": "Bearer " + f.token}
	for name, tc := range map[string]struct {
		form   url.Values
		header map[string]string
		want   int
	}{
		"no token":     {url.Values{"id": {itoa(f.entry)}, "csrf": {csrf}, "confirm": {"yes"}}, nil, http.StatusUnauthorized},
		"wrong token":  {url.Values{"id": {itoa(f.entry)}, "csrf": {csrf}, "confirm": {"yes"}}, map[string]string{"Authorization": "Bearer nope"}, http.StatusUnauthorized},
		"no csrf":      {url.Values{"id": {itoa(f.entry)}, "confirm": {"yes"}}, auth, http.StatusForbidden},
		"other origin": {url.Values{"id": {itoa(f.entry)}, "csrf": {csrf}, "confirm": {"yes"}}, map[string]string{"Authorization": "Bearer " + f.token, "Origin": "https://evil.example"}, http.StatusForbidden},
		"wrong csrf":   {url.Values{"id": {itoa(f.entry)}, "csrf": {strings.Repeat("0", 64)}, "confirm": {"yes"}}, auth, http.StatusForbidden},
	} {
		if resp := f.post(t, "/actions/discard", tc.form, tc.header); resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", name, resp.StatusCode, tc.want)
		}
	}
	if n := f.b.Int("SELECT count(*) FROM " + f.b.Schema + ".dead_letters WHERE status = 'pending'"); n != 1 {
		t.Fatal("a refused action changed the entry")
	}
	if resp := f.post(t, "/actions/discard", url.Values{"id": {itoa(f.entry)}, "csrf": {csrf}}, auth); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("an action without confirm=yes: %d, want 400", resp.StatusCode)
	}
	resp := f.post(t, "/actions/discard", url.Values{"id": {itoa(f.entry)}, "csrf": {csrf}, "confirm": {"yes"}, "back": {"/dlq"}}, auth)
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/dlq?flash=") {
		t.Fatalf("authorized discard: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if n := f.b.Int("SELECT count(*) FROM " + f.b.Schema + ".dead_letters WHERE status = 'discarded'"); n != 1 {
		t.Fatal("the authorized discard did not happen")
	}
	// Basic auth with the token as password works too; an open redirect
	// through "back" does not.
	resp = f.post(t, "/actions/pause", url.Values{"group": {"nobody"}, "topic": {"orders"}, "csrf": {csrf}, "confirm": {"yes"}, "back": {"//evil.example/x"}},
		map[string]string{"Authorization": "Basic " + basic("ops", f.token)})
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("pause of an unknown group with basic auth: %d, want 404", resp.StatusCode)
	}
}

func basic(user, pw string) string {
	req, _ := http.NewRequest(http.MethodGet, "http://x", nil)
	req.SetBasicAuth(user, pw)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Characters a page would not show as themselves (escape sequences,
// bidirectional overrides, zero-width characters) are shown as escapes on
// every page, so that "bil\u200bling" does not pass for "billing".
func TestHiddenCharactersAreShownAsEscapes(t *testing.T) {
	f := newFixture(t, true)
	id := itoa(f.addDeadLetter(t, outbox.RejectedMessage{Group: "bil\u200bling", Topic: "orders", UUID: "u\u2066id",
		PartitionKey: "abc\u202edef", Payload: []byte("{\"a\":\"x\u202ey\"}\n"), Metadata: map[string]string{"k\u202e": "v\u200b"},
		Reason: errors.New("\x1b]0;owned\a\x1b[2J failed")}))
	for _, path := range []string{"/dlq/" + id, "/dlq", "/confirm/retry-held?group=bil%E2%80%8Bling&topic=orders&partition=0&key=abc%E2%80%AEdef"} {
		_, page := f.get(t, path)
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
	_, page := f.get(t, "/dlq/"+id)
	for _, want := range []string{`abc\u202edef`, `u\u2066id`, `k\u202e`, `v\u200b`, `x\u202ey`, `\x1b]0;owned\x07\x1b[2J failed`} {
		if !strings.Contains(page, want) {
			t.Errorf("the dead-letter page does not show %q", want)
		}
	}
	if _, body := f.get(t, "/dlq/"+id+"/payload"); body != "{\"a\":\"x\u202ey\"}\n" {
		t.Errorf("the download is not the exact payload: %q", body)
	}
}
