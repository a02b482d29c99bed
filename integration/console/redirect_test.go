package console

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// In a real browser, on a confirmation page opened from a link with a
// hostile "back": Cancel, and the redirect after Confirm, stay on the
// console. The other host is a real server, so that a browser that left
// the console would be seen there.
func TestWaysBackStayOnTheConsoleInARealBrowser(t *testing.T) {
	f := consoletest.New(t, true)
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`<!doctype html><h1 id="elsewhere">another host</h1>`))
	}))
	t.Cleanup(elsewhere.Close)
	other := strings.TrimPrefix(elsewhere.URL, "http://")
	console := strings.TrimPrefix(f.Server.URL, "http://")
	ctx := browser(t, true, f.Token)

	// leaveConfirmation clicks sel on the confirmation page and returns
	// where the browser went.
	leaveConfirmation := func(back, sel string) (host, path string) {
		t.Helper()
		id := consoletest.Itoa(f.AddDeadLetter(t, outboxtype.RejectedMessage{}))
		if err := chromedp.Run(ctx, chromedp.Navigate(f.Server.URL+"/confirm/discard?id="+id+"&back="+url.QueryEscape(back)),
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
