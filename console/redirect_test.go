package console_test

import (
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
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
			f := newFixtureWith(t, true, prefix, nil)
			csrf := f.csrf(t)
			auth := map[string]string{"Authorization": "Bearer " + f.token}
			for _, back := range hostileBacks {
				id := itoa(f.addDeadLetter(t, outbox.RejectedMessage{}))
				code, body := f.get(t, prefix+"/confirm/discard?id="+id+"&back="+url.QueryEscape(back))
				if code != http.StatusOK {
					t.Fatalf("confirmation page with back %q: %d", back, code)
				}
				if m := cancelLink.FindStringSubmatch(body); m == nil || html.UnescapeString(m[1]) != prefix+"/" {
					t.Errorf("back %q: Cancel leads to %q, want the overview %q", back, m, prefix+"/")
				}
				if m := backField.FindStringSubmatch(body); m == nil || html.UnescapeString(m[1]) != "/" {
					t.Errorf("back %q: the form posts back %q, want the overview", back, m)
				}
				resp := f.post(t, prefix+"/actions/discard", url.Values{"id": {id}, "csrf": {csrf}, "confirm": {"yes"}, "back": {back}}, auth)
				loc := resp.Header.Get("Location")
				u, err := url.Parse(loc)
				if resp.StatusCode != http.StatusSeeOther || err != nil || u.Scheme != "" || u.Host != "" || u.Path != prefix+"/" ||
					strings.ContainsAny(loc, "\\\t\r\n ") || strings.HasPrefix(loc, "//") {
					t.Errorf("back %q: the action redirects (%d) to %q, want the overview %q", back, resp.StatusCode, loc, prefix+"/")
				}
			}

			// A way back on the console is kept, and the page it leads to
			// shows the action's flash; a flash from a crafted link is not shown.
			id := itoa(f.addDeadLetter(t, outbox.RejectedMessage{}))
			_, body := f.get(t, prefix+"/confirm/discard?id="+id+"&back="+url.QueryEscape("/dlq?status=pending"))
			if m := cancelLink.FindStringSubmatch(body); m == nil || html.UnescapeString(m[1]) != prefix+"/dlq?status=pending" {
				t.Fatalf("Cancel of a page on the console leads to %q", m)
			}
			resp := f.post(t, prefix+"/actions/discard", url.Values{"id": {id}, "csrf": {csrf}, "confirm": {"yes"}, "back": {"/dlq?status=pending&flash=old"}}, auth)
			u, _ := url.Parse(resp.Header.Get("Location"))
			if resp.StatusCode != http.StatusSeeOther || u.Path != prefix+"/dlq" || u.Query().Get("status") != "pending" || u.Query().Get("flash") != "discarded "+id {
				t.Fatalf("discard redirects (%d) to %q", resp.StatusCode, resp.Header.Get("Location"))
			}
			if _, page := f.get(t, u.RequestURI()); !strings.Contains(page, `id="flash">discarded `+id) {
				t.Fatal("the page after the action does not show its flash")
			}
			forged := url.Values{"flash": {"Session expired: log in again at evil.example"}, "flash_mac": {strings.Repeat("0", 32)}}
			if _, page := f.get(t, prefix+"/dlq?"+forged.Encode()); strings.Contains(page, "evil.example") {
				t.Fatal("a flash from a crafted link is shown")
			}
		})
	}
}

// In a real browser, on a confirmation page opened from a link with a
// hostile "back": Cancel, and the redirect after Confirm, stay on the
// console. The other host is a real server, so that a browser that left
// the console would be seen there.
func TestWaysBackStayOnTheConsoleInARealBrowser(t *testing.T) {
	f := newFixture(t, true)
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`<!doctype html><h1 id="elsewhere">another host</h1>`))
	}))
	t.Cleanup(elsewhere.Close)
	other := strings.TrimPrefix(elsewhere.URL, "http://")
	console := strings.TrimPrefix(f.srv.URL, "http://")
	ctx := browser(t, true, f.token)

	// leaveConfirmation clicks sel on the confirmation page and returns
	// where the browser went.
	leaveConfirmation := func(back, sel string) (host, path string) {
		t.Helper()
		id := itoa(f.addDeadLetter(t, outbox.RejectedMessage{}))
		if err := chromedp.Run(ctx, chromedp.Navigate(f.srv.URL+"/confirm/discard?id="+id+"&back="+url.QueryEscape(back)),
			chromedp.WaitVisible(sel, chromedp.ByQuery), chromedp.Click(sel, chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
		outboxtest.WaitFor(t, "the browser to leave the confirmation page", 30*time.Second, func() bool {
			var loc string
			err := chromedp.Run(ctx, chromedp.Evaluate(`document.readyState === "complete" ? location.host + " " + location.pathname : ""`, &loc))
			if err != nil || loc == "" || strings.Contains(loc, "/confirm/") {
				return false
			}
			host, path, _ = strings.Cut(loc, " ")
			return true
		})
		return host, path
	}
	for _, back := range []string{"//" + other + "/x", "///" + other + "/x", `/\` + other + "/x", "/\t/" + other + "/x", "/%2F" + other + "/x"} {
		if host, path := leaveConfirmation(back, "#cancel"); host != console || path != "/" {
			t.Errorf("Cancel on a page with back %q went to %s%s, want the console's overview %s/", back, host, path, console)
		}
		if host, path := leaveConfirmation(back, "#confirm"); host != console || path != "/" {
			t.Errorf("Confirm on a page with back %q went to %s%s, want the console's overview %s/", back, host, path, console)
		}
	}
	if host, path := leaveConfirmation("/dlq?status=discarded", "#confirm"); host != console || path != "/dlq" {
		t.Fatalf("Confirm went to %s%s, want %s/dlq, the page it came from", host, path, console)
	}
	if flash := text(t, ctx, "#flash"); !strings.HasPrefix(flash, "discarded ") {
		t.Fatalf("flash after the discard: %q", flash)
	}
}
