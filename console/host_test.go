package console_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// A page of another site that rebinds its name to the console's address
// sends its own name as the Host: read pages, the status API, static
// files, the payload download and actions are all refused for it; the
// loopback names pass at any port, and so do the hosts the configuration
// names.
func TestRequestsForOtherHostsAreRefused(t *testing.T) {
	f := consoletest.NewWith(t, true, "", func(c *console.Config) { c.AllowedHosts = []string{"ops.example.com", "10.0.0.5:8080"} })
	port := f.Server.URL[strings.LastIndex(f.Server.URL, ":")+1:]
	id := consoletest.Itoa(f.Entry)
	reads := []string{"/", "/dlq", "/dlq/" + id, "/dlq/" + id + "/payload", "/groups/orders/billing", "/api/status",
		"/static/console.css", "/static/console.js", "/static/", "/confirm/discard?id=" + id, "/no/such/page"}
	csrf := f.CSRF(t)
	action := url.Values{"id": {id}, "csrf": {csrf}, "confirm": {"yes"}, "back": {"/dlq"}}
	for _, host := range []string{"evil.example", "evil.example:" + port, "EVIL.example:" + port, "localhost.evil.example:" + port,
		"127.0.0.1.nip.io:" + port, "localtest.me:" + port, "ops.example.com.evil.example", "10.0.0.5:9090", "10.0.0.5",
		"127.0.0.2:" + port, "0.0.0.0:" + port, "[::2]:" + port, "evil.example:" + port + "@localhost"} {
		for _, path := range reads {
			code, body := f.Do(t, http.MethodGet, path, host, nil, nil)
			if code != http.StatusMisdirectedRequest || !strings.Contains(body, "does not answer to the host") {
				t.Errorf("GET %s for host %q: %d, want 421", path, host, code)
			}
			if strings.Contains(body, "pwned") || strings.Contains(body, "<") {
				t.Errorf("GET %s for host %q: the refusal shows console data or markup: %q", path, host, body)
			}
		}
		origin := map[string]string{"Authorization": "Bearer " + f.Token, "Origin": "http://" + host}
		if code, _ := f.Do(t, http.MethodPost, "/actions/discard", host, action, origin); code != http.StatusMisdirectedRequest {
			t.Errorf("POST an action for host %q: %d, want 421", host, code)
		}
	}
	if n := f.B.Int("SELECT count(*) FROM " + f.B.Schema + ".dead_letters WHERE status = 'pending'"); n != 1 {
		t.Fatal("an action for another host changed the dead letter")
	}
	// A request without a Host header (HTTP/1.0) is refused too; what a
	// refusal says is the Host quoted, as plain text.
	for _, host := range []string{"", "<script>x</script>", "evil.example\x1b]0;x\a"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Host = host
		f.Console.ServeHTTP(rec, req)
		if rec.Code != http.StatusMisdirectedRequest || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") ||
			strings.Contains(rec.Body.String(), "<script>") || strings.Contains(rec.Body.String(), "\x1b") {
			t.Errorf("a request for host %q: %d %q", host, rec.Code, rec.Body.String())
		}
	}

	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LocalHost:" + port, "localhost.:" + port, "[::1]:" + port,
		"localhost:9000", "localhost", "127.0.0.1", "ops.example.com", "OPS.Example.COM:443", "ops.example.com.", "10.0.0.5:8080"} {
		for _, path := range []string{"/", "/dlq/" + id, "/static/console.css"} {
			if code, _ := f.Do(t, http.MethodGet, path, host, nil, nil); code != http.StatusOK {
				t.Errorf("GET %s for host %q: %d, want 200", path, host, code)
			}
		}
	}
	if code, _ := f.Do(t, http.MethodPost, "/actions/discard", "ops.example.com", action,
		map[string]string{"Authorization": "Bearer " + f.Token, "Origin": "http://ops.example.com"}); code != http.StatusSeeOther {
		t.Fatalf("an action for an allowed host: %d, want 303", code)
	}
}

// By default (a console mounted in an application that named no hosts)
// only the loopback names pass.
func TestByDefaultOnlyLoopbackNamesPass(t *testing.T) {
	f := consoletest.NewWith(t, false, "/outbox", nil)
	for host, want := range map[string]int{
		"localhost:8080": http.StatusOK, "127.0.0.1": http.StatusOK, "[::1]:443": http.StatusOK,
		"app.example.com": http.StatusMisdirectedRequest, "evil.example:8080": http.StatusMisdirectedRequest,
		"10.0.0.5:8080": http.StatusMisdirectedRequest,
	} {
		if code, _ := f.Do(t, http.MethodGet, "/outbox/dlq", host, nil, nil); code != want {
			t.Errorf("GET /outbox/dlq for host %q: %d, want %d", host, code, want)
		}
	}
}

// Entries of AllowedHosts, and mount prefixes, that cannot work are
// configuration errors.
func TestAllowedHostsAndPrefixAreValidated(t *testing.T) {
	f := consoletest.New(t, false)
	for _, hosts := range [][]string{{""}, {"http://ops.example.com"}, {"ops.example.com/console"}, {"*.example.com"}, {"*"},
		{"ops example"}, {"ops.example.com:0"}, {"ops.example.com:99999"}, {"ops.example.com:http"}, {"[::1"}, {":8080"},
		{"ops..example.com"}, {"user@ops.example.com"}, {"ops.example.com\t"}} {
		_, err := console.New(console.Config{Pool: f.B.Pool, Schema: f.B.Schema, AllowedHosts: hosts}, nil)
		var ce *outboxtype.ConfigError
		if !errors.Is(err, outbox.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != "AllowedHosts" {
			t.Errorf("AllowedHosts %q: %v, want a ConfigError for AllowedHosts", hosts, err)
		}
	}
	for _, prefix := range []string{"outbox", "/outbox/", "//evil.example", `/\evil.example`, "/a/../b", "/a?b", "/a b"} {
		_, err := console.New(console.Config{Pool: f.B.Pool, Schema: f.B.Schema, Prefix: prefix}, nil)
		var ce *outboxtype.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Prefix" {
			t.Errorf("Prefix %q: %v, want a ConfigError for Prefix", prefix, err)
		}
	}
	if _, err := console.New(console.Config{Pool: f.B.Pool, Schema: f.B.Schema, Prefix: "/ops/outbox",
		AllowedHosts: []string{"ops.example.com", "ops.example.com:8443", "10.0.0.5", "[fd00::5]:8443", "fd00::6", "outbox-console"}}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestListenHosts(t *testing.T) {
	f := consoletest.New(t, false)
	for addr, want := range map[string]string{
		"127.0.0.1:8080": "", "localhost:8080": "", "[::1]:8080": "", ":8080": "", "0.0.0.0:8080": "", "[::]:8080": "", "bad": "",
		"10.0.0.5:8080": "10.0.0.5:8080", "ops.example.com:80": "ops.example.com:80", "[fd00::5]:8443": "[fd00::5]:8443",
	} {
		got := strings.Join(console.ListenHosts(addr), ",")
		if got != want {
			t.Errorf("ListenHosts(%q) = %q, want %q", addr, got, want)
		}
		if got != "" {
			if _, err := console.New(console.Config{Pool: f.B.Pool, Schema: f.B.Schema, AllowedHosts: console.ListenHosts(addr)}, nil); err != nil {
				t.Errorf("ListenHosts(%q) is not a valid AllowedHosts entry: %v", addr, err)
			}
		}
	}
}
