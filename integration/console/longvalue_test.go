package console

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// In a real browser, at 1400×1000: the dead-letter page of a 1 MB payload
// and a 54 KB key stays about a screen high and never wider than the
// window, with every "show all" open too; the group page with a held 54 KB
// key keeps its grid in one line per partition and within the window.
func TestLongValuesKeepThePageBoundedInARealBrowser(t *testing.T) {
	f := consoletest.New(t, false)
	id := consoletest.Itoa(f.AddDeadLetter(t, consoletest.LongDeadLetter()))
	ctx := browser(t, false, "")

	type size struct{ Width, Height, Window, Widest float64 }
	measure := func(openAll bool) size {
		t.Helper()
		var s size
		js := `(function () {
			if (` + map[bool]string{true: "true", false: "false"}[openAll] + `) document.querySelectorAll("details").forEach(function (d) { d.open = true; });
			var widest = 0;
			document.querySelectorAll("main *").forEach(function (e) { widest = Math.max(widest, e.getBoundingClientRect().right); });
			return {Width: document.documentElement.scrollWidth, Height: document.documentElement.scrollHeight,
				Window: window.innerWidth, Widest: widest};
		})()`
		if err := chromedp.Run(ctx, chromedp.Evaluate(js, &s)); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if err := chromedp.Run(ctx, chromedp.Navigate(f.Server.URL+"/dlq/"+id), chromedp.WaitVisible("#payload", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	for _, openAll := range []bool{false, true} {
		if s := measure(openAll); s.Height > 4000 || s.Width > s.Window || s.Widest > s.Window {
			t.Errorf("dead-letter page (every show all open: %v): %.0f×%.0f px (widest element to %.0f) in a window %.0f px wide",
				openAll, s.Width, s.Height, s.Widest, s.Window)
		}
	}
	var payloadHeight float64
	if err := chromedp.Run(ctx, chromedp.Evaluate(`document.getElementById("payload").getBoundingClientRect().height`, &payloadHeight)); err != nil {
		t.Fatal(err)
	}
	if payloadHeight > 1000 {
		t.Errorf("the payload box is %.0f px high", payloadHeight)
	}

	for _, path := range []string{"/dlq", "/"} {
		if err := chromedp.Run(ctx, chromedp.Navigate(f.Server.URL+path), chromedp.WaitVisible("main h1", chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
		if s := measure(true); s.Height > 3000 || s.Width > s.Window || s.Widest > s.Window {
			t.Errorf("%s: %.0f×%.0f px (widest element to %.0f) in a window %.0f px wide", path, s.Width, s.Height, s.Widest, s.Window)
		}
	}

	// A held key of 54 KB, and a failing partition, next to the grid.
	key := consoletest.LongText(54_000, "KEY-END")
	f.B.Publish("orders", outboxtest.Keyed("h1", key, 1, "x"), outboxtest.Keyed("h2", key, 2, "x"), outboxtest.Keyed("ok", "short", 3, "x"))
	store, err := deadletter.NewStore(deadletter.Config{Schema: f.B.Schema, Pool: f.B.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.B.HoldingConsumer("billing", "orders", store, key)
	outboxtest.WaitFor(t, "the key held", 30*time.Second, func() bool { return f.B.Rows("held") == 2 })
	f.B.Exec("UPDATE " + f.B.Schema + ".cursors SET last_error = repeat('e', 4000) WHERE group_name = 'billing'")
	if err := chromedp.Run(ctx, chromedp.Navigate(f.Server.URL+"/groups/orders/billing"), chromedp.WaitVisible("#held", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	for _, openAll := range []bool{false, true} {
		if s := measure(openAll); s.Height > 4000 || s.Width > s.Window || s.Widest > s.Window {
			t.Errorf("group page (every show all open: %v): %.0f×%.0f px (widest element to %.0f) in a window %.0f px wide",
				openAll, s.Width, s.Height, s.Widest, s.Window)
		}
	}
	// The grid keeps its layout: every column at least as wide as its
	// numbers, and a row no higher than a few lines of its cut error.
	var grid struct {
		Narrowest, Tallest, Width float64
		Columns                   int
	}
	if err := chromedp.Run(ctx, chromedp.Evaluate(`document.querySelectorAll("details").forEach(function (d) { d.open = false; });
		(function () {
			var g = document.getElementById("grid"), narrowest = 1e9, tallest = 0;
			g.querySelectorAll("tbody tr").forEach(function (tr) {
				tallest = Math.max(tallest, tr.getBoundingClientRect().height);
				Array.prototype.slice.call(tr.cells, 0, 5).forEach(function (td) { narrowest = Math.min(narrowest, td.getBoundingClientRect().width); });
			});
			return {Narrowest: narrowest, Tallest: tallest, Width: g.getBoundingClientRect().width, Columns: g.rows[0].cells.length};
		})()`, &grid)); err != nil {
		t.Fatal(err)
	}
	if grid.Tallest > 150 || grid.Narrowest < 30 || grid.Columns != 10 {
		t.Errorf("the grid lost its layout: rows up to %.0f px high, a number column %.0f px wide, %d columns, %.0f px wide",
			grid.Tallest, grid.Narrowest, grid.Columns, grid.Width)
	}

	// The grid's live updates cut and escape as the server does.
	f.B.Exec("UPDATE " + f.B.Schema + ".cursors SET last_error = 'evil' || chr(8238) || 'txet ' || repeat('z', 300) WHERE group_name = 'billing' AND partition = 1")
	outboxtest.WaitFor(t, "the grid to show the new error", 30*time.Second, func() bool {
		var short string
		err := chromedp.Run(ctx, chromedp.Evaluate(`(document.querySelector("#p1 [data-f=error] .short") || {}).textContent || ""`, &short))
		return err == nil && strings.HasPrefix(short, `evil\u202etxet zzz`)
	})
	var shown struct{ Short, Summary, Full string }
	if err := chromedp.Run(ctx, chromedp.Evaluate(`(function () {
		var c = document.querySelector("#p1 [data-f=error]");
		return {Short: c.querySelector(".short").textContent, Summary: c.querySelector("summary").textContent, Full: c.querySelector(".full").textContent};
	})()`, &shown)); err != nil {
		t.Fatal(err)
	}
	if len([]rune(shown.Short)) != 201 || shown.Summary != "show all 315 characters" || shown.Full != `evil\u202etxet `+strings.Repeat("z", 300) {
		t.Errorf("the live update shows %+v", shown)
	}
}
