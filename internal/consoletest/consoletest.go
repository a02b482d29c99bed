// Package consoletest is the test fixture of the web console's tests: the
// console package's own (requests over HTTP) and the browser tests in
// integration/console (a real headless Chromium). One call gives a test a
// migrated schema with a topic, a consumer group and a dead letter whose
// every field is hostile markup, and a console server on it; the fixture's
// methods send the requests those tests repeat. Failures end the test.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		f := consoletest.New(t, true)
//		code, body := f.Get(t, "/dlq/"+consoletest.Itoa(f.Entry))
//		...
//	}
//
// Only _test.go files import it; it drives no browser.
package consoletest

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

	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Hostile is markup that runs script if a page renders it instead of
// showing it as text: it sets window.__pwned.
const Hostile = `<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">`

// Fixture is a migrated schema with topic "orders" (2 partitions), a dead
// letter of group "billing" whose uuid, payload, metadata and reason carry
// Hostile, and a console server on it.
type Fixture struct {
	// B is the test's outbox: its pool and schema.
	B *outboxtest.Bundle
	// Server serves the console (mounted under Prefix), closed with the test.
	Server *httptest.Server
	// Console is the handler Server serves.
	Console *console.Console
	// Prefix is the path the console is mounted under ("" for the root).
	Prefix string
	// Entry is the id of the hostile dead letter.
	Entry int64
	// Token is the console's Config.Token.
	Token string
	// Client sends the fixture's requests; it does not follow redirects.
	Client *http.Client
}

// New is NewWith without a mount prefix or a change of configuration.
func New(t testing.TB, enableActions bool) *Fixture {
	t.Helper()
	return NewWith(t, enableActions, "", nil)
}

// NewWith mounts the console under prefix (with http.StripPrefix, as an
// application does) after edit, when set, changed its configuration.
func NewWith(t testing.TB, enableActions bool, prefix string, edit func(*console.Config)) *Fixture {
	t.Helper()
	b := outboxtest.Setup(t)
	b.Register("orders", 2)
	store, err := deadletter.NewStore(deadletter.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Add(context.Background(), outboxtype.RejectedMessage{Group: "billing", Topic: "orders", UUID: "evil-" + Hostile,
		Payload: []byte(Hostile), Metadata: map[string]string{"note": Hostile}, Reason: hostileErr{}}); err != nil {
		t.Fatal(err)
	}
	page, err := store.List(context.Background(), deadletter.ListOptions{})
	if err != nil || len(page.Entries) != 1 {
		t.Fatalf("dead letter: %v %v", page, err)
	}
	f := &Fixture{B: b, Entry: page.Entries[0].ID, Token: "s3cret-token",
		Client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	cfg := console.Config{Pool: b.Pool, Schema: b.Schema, EnableActions: enableActions, Token: f.Token, Prefix: prefix}
	if edit != nil {
		edit(&cfg)
	}
	c, err := console.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.Console, f.Prefix = c, prefix
	var h http.Handler = c
	if prefix != "" {
		mux := http.NewServeMux()
		mux.Handle(prefix+"/", http.StripPrefix(prefix, c))
		h = mux
	}
	f.Server = httptest.NewServer(h)
	t.Cleanup(f.Server.Close)
	return f
}

type hostileErr struct{}

func (hostileErr) Error() string { return "reason " + Hostile }

// Get requests path (prefix included) and returns the status and the body.
func (f *Fixture) Get(t testing.TB, path string) (int, string) {
	t.Helper()
	resp, err := f.Client.Get(f.Server.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// CSRF is the CSRF token a confirmation page of the console carries.
func (f *Fixture) CSRF(t testing.TB) string {
	t.Helper()
	_, body := f.Get(t, f.Prefix+"/confirm/discard?id="+Itoa(f.Entry))
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token on the page")
	}
	return m[1]
}

// AddDeadLetter stores a pending dead letter and returns its id. A zero
// Group and Topic become "billing" and "orders", a zero UUID a new one.
func (f *Fixture) AddDeadLetter(t testing.TB, m outboxtype.RejectedMessage) int64 {
	t.Helper()
	store, err := deadletter.NewStore(deadletter.Config{Schema: f.B.Schema, Pool: f.B.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Group == "" {
		m.Group, m.Topic = "billing", "orders"
	}
	if m.UUID == "" {
		m.UUID = watermill.NewUUID()
	}
	// A group name a Subscriber refuses (control or format characters,
	// over 200 bytes) is one an older release stored: Store.Add refuses it
	// now, so the entry is added under a stand-in and renamed as it was.
	group := m.Group
	if names.Group(group) != nil {
		m.Group = "consoletest-stand-in"
	}
	if _, err := store.Add(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	id := f.B.Int("SELECT max(id) FROM " + f.B.Schema + ".dead_letters")
	if group != m.Group {
		f.B.Exec("UPDATE "+f.B.Schema+".dead_letters SET group_name = $1 WHERE id = $2", group, id)
	}
	return id
}

// Post posts form to path (prefix included) with header and returns the
// response, its body closed.
func (f *Fixture) Post(t testing.TB, path string, form url.Values, header map[string]string) *http.Response {
	t.Helper()
	if form == nil {
		form = url.Values{}
	}
	resp := f.send(t, http.MethodPost, path, "", form, header)
	resp.Body.Close()
	return resp
}

// Do sends a request for host (the Host header) to the console, with form
// as its body when set, and returns the status and the body.
func (f *Fixture) Do(t testing.TB, method, path, host string, form url.Values, header map[string]string) (int, string) {
	t.Helper()
	resp := f.send(t, method, path, host, form, header)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// send sends a request to the console: for host ("" for the server's
// address), with form as its body when set.
func (f *Fixture) send(t testing.TB, method, path, host string, form url.Values, header map[string]string) *http.Response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, f.Server.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := f.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// Itoa is n in decimal: a dead letter's id as pages and forms carry it.
func Itoa(n int64) string { return strconv.FormatInt(n, 10) }

// LongText is n bytes of text without a space to break a line at, ending
// in marker.
func LongText(n int, marker string) string {
	return strings.Repeat("x", n-len(marker)) + marker
}

// LongDeadLetter is a dead letter with a 1 MB payload (ending in Hostile),
// a 54 KB key, a 54 KB uuid and metadata value, a 200 KB metadata value,
// and long names, each ending in a marker ("PAYLOAD-END", "KEY-END", ...).
func LongDeadLetter() outboxtype.RejectedMessage {
	return outboxtype.RejectedMessage{
		Group: LongText(3000, "GROUP-END"), Topic: LongText(3000, "TOPIC-END"), UUID: LongText(54_000, "UUID-END"),
		PartitionKey: LongText(54_000, "KEY-END"),
		Payload:      []byte(LongText(1_000_000, "PAYLOAD-END"+Hostile)),
		Metadata:     map[string]string{"note": LongText(54_000, "NOTE-END"), "huge": LongText(200_000, "HUGE-END"), LongText(500, "MDKEY-END"): "v"},
		Reason:       errors.New(LongText(10_000, "REASON-END")),
	}
}
