package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// sourcesSchema is every shard's outbox schema: the same name in each
// database, as in a sharded application.
const sourcesSchema = "shop"

// twoShards are two databases with the same schema and figures of their
// own: eu has topic orders-eu (4 partitions, 5 messages waiting for the
// sequencer, which group billing, with partition 0 paused, is owed: lag
// 5), us has topics
// orders-us (2 partitions) and payments-us (3 partitions, 3 messages
// sequenced, which group billing has yet to handle: lag 3).
func twoShards(t *testing.T) (eu, us *outboxtest.Bundle) {
	t.Helper()
	eu = outboxtest.Shard(t, sourcesSchema)
	eu.Register("orders-eu", 4)
	eu.PublishN("orders-eu", 5, "eu-")
	eu.Exec("INSERT INTO " + sourcesSchema + ".cursors (group_name, topic, partition, paused) VALUES ('billing', 'orders-eu', 0, true), ('billing', 'orders-eu', 1, false)")
	us = outboxtest.Shard(t, sourcesSchema)
	us.Register("orders-us", 2)
	us.Register("payments-us", 3)
	us.PublishN("payments-us", 3, "us-")
	if n := us.SequenceAll(); n != 3 {
		t.Fatalf("sequenced %d, want 3", n)
	}
	us.Exec("INSERT INTO " + sourcesSchema + ".cursors (group_name, topic, partition) VALUES ('billing', 'payments-us', 0), ('billing', 'payments-us', 1), ('billing', 'payments-us', 2)")
	return eu, us
}

// sourcesServer serves a Sources console, mounted under cfg.Console.Prefix
// as an application does (http.StripPrefix).
func sourcesServer(t *testing.T, cfg console.SourcesConfig) *httptest.Server {
	t.Helper()
	s, err := console.NewSources(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = s
	if p := cfg.Console.Prefix; p != "" {
		mux := http.NewServeMux()
		mux.Handle(p+"/", http.StripPrefix(p, s))
		h = mux
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// fetch requests path of srv for host ("" for the server's own) and
// returns the response and its body.
func fetch(t *testing.T, srv *httptest.Server, method, path, host string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// sourcesJSON is /api/sources.
type sourcesJSON struct {
	Sources []struct {
		Name      string         `json:"name"`
		Schema    string         `json:"schema"`
		Reachable bool           `json:"reachable"`
		Error     string         `json:"error"`
		Summary   *admin.Summary `json:"summary"`
	} `json:"sources"`
	Total       admin.Summary `json:"total"`
	Reachable   int           `json:"reachable"`
	Unreachable int           `json:"unreachable"`
	TotalState  string        `json:"total_state"`
}

func apiSources(t *testing.T, srv *httptest.Server, prefix string) sourcesJSON {
	t.Helper()
	resp, body := fetch(t, srv, http.MethodGet, prefix+"/api/sources", "")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("GET /api/sources: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var j sourcesJSON
	if err := json.Unmarshal([]byte(body), &j); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return j
}

// row is the table row of id on the page, cut out.
func row(t *testing.T, page, id string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr id="` + regexp.QuoteMeta(id) + `"[^>]*>.*?</tr>`).FindString(page)
	if m == "" {
		t.Fatalf("no row %s on the page:\n%s", id, page)
	}
	return m
}

// cell is the value of the cell data-f=field of a row.
func cell(t *testing.T, row, field string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)data-f="` + field + `"[^>]*>(.*?)</td>`).FindStringSubmatch(row)
	if m == nil {
		t.Fatalf("no cell %s in %s", field, row)
	}
	return strings.TrimSpace(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(m[1], ""))
}

// The sources page shows each database's own figures side by side and
// their total, as HTML and as JSON; each name leads to its console.
func TestSourcesPageShowsEverySourceAndTheTotal(t *testing.T) {
	eu, us := twoShards(t)
	srv := sourcesServer(t, console.SourcesConfig{Sources: []console.Source{
		{Name: "eu", Pool: eu.Pool, Schema: sourcesSchema}, {Name: "us", Pool: us.Pool, Schema: sourcesSchema}}})

	j := apiSources(t, srv, "")
	if len(j.Sources) != 2 || j.Sources[0].Name != "eu" || j.Sources[1].Name != "us" || j.Reachable != 2 || j.Unreachable != 0 {
		t.Fatalf("sources %+v", j)
	}
	wantEU := admin.Summary{Topics: 1, Partitions: 4, Pending: 5, Lag: 5, Paused: 1} // the messages waiting for the sequencer are owed to billing too
	wantUS := admin.Summary{Topics: 2, Partitions: 5, Sequenced: 3, Lag: 3}
	for i, want := range []admin.Summary{wantEU, wantUS} {
		got := j.Sources[i].Summary
		if got == nil || !j.Sources[i].Reachable || j.Sources[i].Schema != sourcesSchema {
			t.Fatalf("source %s: %+v", j.Sources[i].Name, j.Sources[i])
		}
		got.MaxLagSeconds = 0 // a matter of the clock
		if *got != want {
			t.Errorf("source %s: %+v, want %+v", j.Sources[i].Name, *got, want)
		}
	}
	total := j.Total
	total.MaxLagSeconds = 0
	if want := wantEU.Plus(wantUS); total != want || want.Topics != 3 || want.Partitions != 9 {
		t.Errorf("total %+v, want %+v", total, want)
	}

	resp, page := fetch(t, srv, http.MethodGet, "/", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "<h1>Sources</h1>") {
		t.Fatalf("GET /: %d\n%s", resp.StatusCode, page)
	}
	for id, want := range map[string]map[string]string{
		"source-eu": {"state": "reachable", "topics": "1", "partitions": "4", "pending": "5", "lag": "5", "paused": "1", "failing": "0", "dead_letters": "0"},
		"source-us": {"state": "reachable", "topics": "2", "partitions": "5", "pending": "0", "lag": "3", "paused": "0"},
		"total":     {"state": "all 2 sources reachable", "topics": "3", "partitions": "9", "pending": "5", "lag": "8", "paused": "1"},
	} {
		r := row(t, page, id)
		for field, v := range want {
			if got := cell(t, r, field); got != v {
				t.Errorf("row %s, %s: %q, want %q", id, field, got, v)
			}
		}
	}
	for _, link := range []string{`href="/sources/eu/"`, `href="/sources/us/"`} {
		if !strings.Contains(page, link) {
			t.Errorf("the page has no link %s", link)
		}
	}
	// The menu's dead letters lead to each source's.
	if resp, page := fetch(t, srv, http.MethodGet, "/dlq", ""); resp.StatusCode != http.StatusOK || !strings.Contains(page, `id="source-eu"`) {
		t.Errorf("GET /dlq: %d", resp.StatusCode)
	}
	// Read-only.
	if resp, _ := fetch(t, srv, http.MethodPost, "/", ""); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d, want 405", resp.StatusCode)
	}
}

// /sources/<name>/ is that source's own console, under the mount prefix:
// its pages show its topics, not another source's, and its links stay
// under its path.
func TestSourcesServesEachSourcesConsole(t *testing.T) {
	eu, us := twoShards(t)
	for _, prefix := range []string{"", "/ops"} {
		srv := sourcesServer(t, console.SourcesConfig{Sources: []console.Source{
			{Name: "eu", Pool: eu.Pool, Schema: sourcesSchema}, {Name: "us", Pool: us.Pool, Schema: sourcesSchema}},
			Console: console.Config{Prefix: prefix}})
		if j := apiSources(t, srv, prefix); j.Reachable != 2 {
			t.Fatalf("prefix %q: %+v", prefix, j)
		}
		_, page := fetch(t, srv, http.MethodGet, prefix+"/", "")
		if !strings.Contains(page, `href="`+prefix+`/sources/eu/"`) || !strings.Contains(page, `href="`+prefix+`/static/console.css"`) {
			t.Errorf("prefix %q: the sources page does not link under the prefix:\n%s", prefix, page)
		}
		if resp, _ := fetch(t, srv, http.MethodGet, prefix+"/static/console.css", ""); resp.StatusCode != http.StatusOK {
			t.Errorf("prefix %q: the stylesheet: %d", prefix, resp.StatusCode)
		}
		base := prefix + "/sources/eu"
		resp, page := fetch(t, srv, http.MethodGet, base+"/", "")
		if resp.StatusCode != http.StatusOK || !strings.Contains(page, "orders-eu") || strings.Contains(page, "payments-us") {
			t.Fatalf("prefix %q: GET %s/: %d\n%s", prefix, base, resp.StatusCode, page)
		}
		hrefs := regexp.MustCompile(`(?:href|src)="([^"]*)"`).FindAllStringSubmatch(page, -1)
		if len(hrefs) < 4 {
			t.Fatalf("prefix %q: %d links on eu's overview", prefix, len(hrefs))
		}
		for _, h := range hrefs {
			if !strings.HasPrefix(h[1], base+"/") && h[1] != prefix+"/" {
				t.Errorf("prefix %q: a link of eu's console leaves it (other than to all sources): %s", prefix, h[1])
			}
		}
		// Which source it is, and the way back to all of them.
		if !strings.Contains(page, `source <b id="source">eu</b>`) || !strings.Contains(page, `<a href="`+prefix+`/" id="all-sources">All sources</a>`) {
			t.Errorf("prefix %q: eu's console does not name its source or link back to all sources:\n%s", prefix, page)
		}
		if resp, page := fetch(t, srv, http.MethodGet, base+"/groups/orders-eu/billing", ""); resp.StatusCode != http.StatusOK || !strings.Contains(page, `id="grid"`) {
			t.Errorf("prefix %q: eu's group page: %d", prefix, resp.StatusCode)
		}
		if resp, _ := fetch(t, srv, http.MethodGet, prefix+"/sources/us/groups/orders-eu/billing", ""); resp.StatusCode != http.StatusNotFound {
			t.Errorf("prefix %q: us's console shows eu's group: %d", prefix, resp.StatusCode)
		}
		if resp, _ := fetch(t, srv, http.MethodGet, base, ""); resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != base+"/" {
			t.Errorf("prefix %q: GET %s: %d to %q, want the console's %s/", prefix, base, resp.StatusCode, resp.Header.Get("Location"), base)
		}
		if resp, _ := fetch(t, srv, http.MethodGet, prefix+"/sources/nowhere", ""); resp.StatusCode != http.StatusNotFound {
			t.Errorf("prefix %q: an unknown source: %d, want 404", prefix, resp.StatusCode)
		}
	}
}

// A source that cannot be read is shown unreachable, with its error as
// text; the total says it is incomplete and counts the others only. A
// source that does not answer holds the page no longer than the timeout.
func TestSourcesShowsAnUnreachableSourceAndAnIncompleteTotal(t *testing.T) {
	eu, _ := twoShards(t)
	// A closed port, and a database name of markup: the connection error
	// names the database.
	down, err := pgxpool.New(context.Background(), "postgres://x@127.0.0.1:1/%3Cscript%3Ewindow.__pwned=1%3C%2Fscript%3E?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(down.Close)
	frozen := outboxtest.Setup(t)
	frozenPool, freeze, thaw := pgtest.FreezablePool(t)
	freeze()
	t.Cleanup(thaw)
	srv := sourcesServer(t, console.SourcesConfig{Sources: []console.Source{
		{Name: "eu", Pool: eu.Pool, Schema: sourcesSchema}, {Name: "down", Pool: down, Schema: sourcesSchema},
		{Name: "stuck", Pool: frozenPool, Schema: frozen.Schema}}, Console: console.Config{Timeout: 2 * time.Second}})

	// The stuck source never answers (its pool is frozen until the test
	// ends): that the page comes back at all is the timeout at work, on a
	// machine of any speed, and the source's state below says it gave up
	// after 2s.
	resp, page := fetch(t, srv, http.MethodGet, "/", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", resp.StatusCode, page)
	}
	if strings.Contains(page, "<script>window") {
		t.Fatal("the error of the source renders as markup")
	}
	downRow := row(t, page, "source-down")
	if state := cell(t, downRow, "state"); !strings.HasPrefix(state, "unreachable") || !strings.Contains(downRow, "&lt;script&gt;window.__pwned=1&lt;/script&gt;") {
		t.Errorf("the down source's row: %s", downRow)
	}
	if state := cell(t, row(t, page, "source-stuck"), "state"); !strings.HasPrefix(state, "unreachable") || !strings.Contains(state, "no answer within 2s") {
		t.Errorf("the stuck source's state: %q", state)
	}
	totalRow := row(t, page, "total")
	if state := cell(t, totalRow, "state"); !strings.Contains(state, "INCOMPLETE") || !strings.Contains(state, "2 of 3 sources unreachable") {
		t.Errorf("the total's state: %q", state)
	}
	if !strings.Contains(totalRow, `class="total warn"`) || cell(t, totalRow, "partitions") != "4" {
		t.Errorf("the total is not marked or not eu's alone: %s", totalRow)
	}

	j := apiSources(t, srv, "")
	if j.Reachable != 1 || j.Unreachable != 2 || j.Sources[1].Reachable || j.Sources[1].Summary != nil ||
		!strings.Contains(j.Sources[1].Error, "<script>") || j.Total.Partitions != 4 || !strings.Contains(j.TotalState, "INCOMPLETE") {
		t.Errorf("/api/sources: %+v", j)
	}

	// The down source's own pages: 503 (the console is fine, its database
	// is not), escaped, with a Retry-After; the stuck one's too.
	for _, path := range []string{"/sources/down/", "/sources/down/api/status", "/sources/stuck/"} {
		resp, body := fetch(t, srv, http.MethodGet, path, "")
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" && !strings.Contains(path, "api") || strings.Contains(body, "<script>window") {
			t.Errorf("GET %s of an unreachable source: %d, Retry-After %q\n%s", path, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}

	// Every source down: no total at all.
	srv = sourcesServer(t, console.SourcesConfig{Sources: []console.Source{{Name: "down", Pool: down}}})
	_, page = fetch(t, srv, http.MethodGet, "/", "")
	if totalRow := row(t, page, "total"); !strings.Contains(totalRow, "no source reachable") || !strings.Contains(totalRow, "no total") {
		t.Errorf("every source down: %s", totalRow)
	}
}

// Every page of the Sources console, its sources' consoles included,
// answers only the hosts it is given: 421 for another.
func TestSourcesRefusesOtherHosts(t *testing.T) {
	eu, _ := twoShards(t)
	srv := sourcesServer(t, console.SourcesConfig{Sources: []console.Source{{Name: "eu", Pool: eu.Pool, Schema: sourcesSchema}},
		Console: console.Config{AllowedHosts: []string{"ops.example.com"}}})
	paths := []string{"/", "/api/sources", "/dlq", "/static/console.css", "/sources/eu/", "/sources/eu/api/status", "/sources/eu", "/no/such/page"}
	for _, path := range paths {
		if resp, body := fetch(t, srv, http.MethodGet, path, "evil.example"); resp.StatusCode != http.StatusMisdirectedRequest || strings.Contains(body, "orders-eu") {
			t.Errorf("GET %s for evil.example: %d, want 421", path, resp.StatusCode)
		}
	}
	for _, host := range []string{"ops.example.com", "localhost"} {
		if resp, _ := fetch(t, srv, http.MethodGet, "/", host); resp.StatusCode != http.StatusOK {
			t.Errorf("GET / for %s: %d, want 200", host, resp.StatusCode)
		}
	}
	resp, _ := fetch(t, srv, http.MethodGet, "/", "")
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
}

// SourcesConfig.Validate and NewSources refuse an impossible
// configuration with the library's typed errors.
func TestSourcesConfigErrorsAreTyped(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://x@127.0.0.1:1/none") // connects lazily: never here
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ok := console.Source{Name: "eu", Pool: pool}
	for _, c := range []struct {
		name  string
		cfg   console.SourcesConfig
		field string // of the *outboxtype.ConfigError; "" for a *outboxtype.NameError
		kind  string // of the *outboxtype.NameError
	}{
		{"no source", console.SourcesConfig{}, "Sources", ""},
		{"a pool in the template", console.SourcesConfig{Sources: []console.Source{ok}, Console: console.Config{Pool: pool}}, "Console.Pool", ""},
		{"a schema in the template", console.SourcesConfig{Sources: []console.Source{ok}, Console: console.Config{Schema: "shop"}}, "Console.Schema", ""},
		{"no pool", console.SourcesConfig{Sources: []console.Source{{Name: "eu"}}}, "Sources[0].Pool", ""},
		{"a name twice", console.SourcesConfig{Sources: []console.Source{ok, ok}}, "Sources[1].Name", ""},
		{"a bad prefix", console.SourcesConfig{Sources: []console.Source{ok}, Console: console.Config{Prefix: "/ops/"}}, "Console.Prefix", ""},
		{"actions without authentication", console.SourcesConfig{Sources: []console.Source{ok}, Console: console.Config{EnableActions: true}}, "Console.EnableActions", ""},
		{"a bad allowed host", console.SourcesConfig{Sources: []console.Source{ok}, Console: console.Config{AllowedHosts: []string{"http://x/"}}}, "Console.AllowedHosts", ""},
		{"no name", console.SourcesConfig{Sources: []console.Source{{Pool: pool}}}, "", "source"},
		{"a name of markup", console.SourcesConfig{Sources: []console.Source{{Name: "<script>x</script>", Pool: pool}}}, "", "source"},
		{"a name that is not a path segment", console.SourcesConfig{Sources: []console.Source{{Name: "..", Pool: pool}}}, "", "source"},
		{"a bad schema", console.SourcesConfig{Sources: []console.Source{{Name: "eu", Pool: pool, Schema: "no schema"}}}, "", "schema"},
	} {
		err := c.cfg.Validate()
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		s, newErr := console.NewSources(c.cfg, nil)
		if s != nil || newErr == nil || newErr.Error() != err.Error() {
			t.Errorf("%s: NewSources gave %v, %v; Validate %v", c.name, s, newErr, err)
		}
		if c.field != "" {
			var ce *outboxtype.ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Errorf("%s: %v (%T), want a ConfigError of field %s", c.name, err, err, c.field)
			}
			continue
		}
		var ne *outboxtype.NameError
		if !errors.As(err, &ne) || ne.Kind != c.kind || !errors.Is(err, outbox.ErrInvalidName) {
			t.Errorf("%s: %v (%T), want a NameError of a %s", c.name, err, err, c.kind)
		}
	}
	if err := (console.SourcesConfig{Sources: []console.Source{ok, {Name: "us-1.b_2", Pool: pool, Schema: "shop"}}}).Validate(); err != nil {
		t.Errorf("a valid configuration: %v", err)
	}
}
