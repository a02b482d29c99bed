package console_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/millrace/watermill-outbox/internal/consoletest"
)

// The console's static files are served; no directory is listed, and
// nothing outside static/ is reachable through it.
func TestStaticFilesAreServedButNoDirectoryIsListed(t *testing.T) {
	f := consoletest.New(t, false)
	follow := &http.Client{}
	get := func(path string) (int, string, string) {
		t.Helper()
		resp, err := follow.Get(f.Server.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	if code, ctype, body := get("/static/console.css"); code != http.StatusOK || !strings.HasPrefix(ctype, "text/css") || !strings.Contains(body, "overflow-wrap") {
		t.Fatalf("GET /static/console.css: %d %s", code, ctype)
	}
	if code, ctype, _ := get("/static/console.js"); code != http.StatusOK || !strings.Contains(ctype, "javascript") {
		t.Fatalf("GET /static/console.js: %d %s", code, ctype)
	}
	for _, path := range []string{"/static/", "/static", "/static/.", "/static/./", "/static/../static/", "/static//",
		"/static/../templates/layout.html", "/static/%2e%2e/templates/layout.html", "/templates/", "/templates/layout.html",
		"/static/index.html", "/static/nope.css", "/static/console.css/"} {
		code, _, body := get(path)
		if code == http.StatusOK || strings.Contains(body, "console.css") || strings.Contains(body, "console.js") ||
			strings.Contains(body, "{{define") || strings.Contains(body, "<pre>") {
			t.Errorf("GET %s: %d, lists or serves what it should not:\n%.300s", path, code, body)
		}
	}
}
