package console_test

import (
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// hostileBacks are ways back that lead off the console (to another host,
// or to another scheme), written as an attacker would put them in a link.
var hostileBacks = []string{
	"//evil.example/x", "///evil.example/x", `/\evil.example/x`, `\/evil.example/x`, `\\evil.example`,
	"/\t/evil.example/x", "/\n/evil.example", "/\r\n/evil.example", "\t//evil.example", " //evil.example",
	"https://evil.example/x", "javascript:alert(1)", "/%2F/evil.example", "/%5Cevil.example", "/%09/evil.example",
	"/%252F%252Fevil.example", "/./../evil.example", "/..//evil.example", "/dlq#@evil.example",
	"/" + strings.Repeat("x", 5000),
}

var cancelLink = regexp.MustCompile(`<a href="([^"]*)" id="cancel">`)
var backField = regexp.MustCompile(`name="back" value="([^"]*)"`)

// The confirmation page's Cancel link and the way back it posts, and the
// action's redirect, stay on the console whatever "back" a link carries:
// at the root and under a mount prefix.
func TestWaysBackStayOnTheConsole(t *testing.T) {
	for _, prefix := range []string{"", "/outbox"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			f := consoletest.NewWith(t, true, prefix, nil)
			csrf := f.CSRF(t)
			auth := map[string]string{"Authorization": "Bearer " + f.Token}
			for _, back := range hostileBacks {
				id := consoletest.Itoa(f.AddDeadLetter(t, outboxtype.RejectedMessage{}))
				code, body := f.Get(t, prefix+"/confirm/discard?id="+id+"&back="+url.QueryEscape(back))
				if code != http.StatusOK {
					t.Fatalf("confirmation page with back %q: %d", back, code)
				}
				if m := cancelLink.FindStringSubmatch(body); m == nil || html.UnescapeString(m[1]) != prefix+"/" {
					t.Errorf("back %q: Cancel leads to %q, want the overview %q", back, m, prefix+"/")
				}
				if m := backField.FindStringSubmatch(body); m == nil || html.UnescapeString(m[1]) != "/" {
					t.Errorf("back %q: the form posts back %q, want the overview", back, m)
				}
				resp := f.Post(t, prefix+"/actions/discard", url.Values{"id": {id}, "csrf": {csrf}, "confirm": {"yes"}, "back": {back}}, auth)
				loc := resp.Header.Get("Location")
				u, err := url.Parse(loc)
				if resp.StatusCode != http.StatusSeeOther || err != nil || u.Scheme != "" || u.Host != "" || u.Path != prefix+"/" ||
					strings.ContainsAny(loc, "\\\t\r\n ") || strings.HasPrefix(loc, "//") {
					t.Errorf("back %q: the action redirects (%d) to %q, want the overview %q", back, resp.StatusCode, loc, prefix+"/")
				}
			}

			// A way back on the console is kept, and the page it leads to
			// shows the action's flash; a flash from a crafted link is not shown.
			id := consoletest.Itoa(f.AddDeadLetter(t, outboxtype.RejectedMessage{}))
			_, body := f.Get(t, prefix+"/confirm/discard?id="+id+"&back="+url.QueryEscape("/dlq?status=pending"))
			if m := cancelLink.FindStringSubmatch(body); m == nil || html.UnescapeString(m[1]) != prefix+"/dlq?status=pending" {
				t.Fatalf("Cancel of a page on the console leads to %q", m)
			}
			resp := f.Post(t, prefix+"/actions/discard", url.Values{"id": {id}, "csrf": {csrf}, "confirm": {"yes"}, "back": {"/dlq?status=pending&flash=old"}}, auth)
			u, _ := url.Parse(resp.Header.Get("Location"))
			if resp.StatusCode != http.StatusSeeOther || u.Path != prefix+"/dlq" || u.Query().Get("status") != "pending" || u.Query().Get("flash") != "discarded "+id {
				t.Fatalf("discard redirects (%d) to %q", resp.StatusCode, resp.Header.Get("Location"))
			}
			if _, page := f.Get(t, u.RequestURI()); !strings.Contains(page, `id="flash">discarded `+id) {
				t.Fatal("the page after the action does not show its flash")
			}
			forged := url.Values{"flash": {"Session expired: log in again at evil.example"}, "flash_mac": {strings.Repeat("0", 32)}}
			if _, page := f.Get(t, prefix+"/dlq?"+forged.Encode()); strings.Contains(page, "evil.example") {
				t.Fatal("a flash from a crafted link is shown")
			}
		})
	}
}
