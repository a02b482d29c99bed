package console_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// longText is n bytes of text without a space to break a line at, ending
// in marker.
func longText(n int, marker string) string {
	return strings.Repeat("x", n-len(marker)) + marker
}

// longDeadLetter is a dead letter with a 1 MB payload, a 54 KB key, a 54 KB
// uuid and metadata value, a 200 KB metadata value, and long names.
func longDeadLetter() outbox.RejectedMessage {
	return outbox.RejectedMessage{
		Group: longText(3000, "GROUP-END"), Topic: longText(3000, "TOPIC-END"), UUID: longText(54_000, "UUID-END"),
		PartitionKey: longText(54_000, "KEY-END"),
		Payload:      []byte(longText(1_000_000, "PAYLOAD-END"+hostile)),
		Metadata:     map[string]string{"note": longText(54_000, "NOTE-END"), "huge": longText(200_000, "HUGE-END"), longText(500, "MDKEY-END"): "v"},
		Reason:       errors.New(longText(10_000, "REASON-END")),
	}
}

// A page shows the first characters of a long value and the whole behind
// "show all" (or, past 64 KiB, says where to find it); a payload shows its
// first 16 KiB and downloads whole, as an attachment never rendered.
func TestLongValuesAreCutWithAWayToTheWhole(t *testing.T) {
	f := newFixture(t, false)
	m := longDeadLetter()
	id := itoa(f.addDeadLetter(t, m))

	code, page := f.get(t, "/dlq/"+id)
	if code != http.StatusOK {
		t.Fatalf("GET /dlq/%s: %d", id, code)
	}
	if len(page) > 400<<10 {
		t.Errorf("the dead-letter page is %d bytes", len(page))
	}
	if strings.Contains(page, "PAYLOAD-END") || strings.Contains(page, "HUGE-END") {
		t.Error("the page carries the whole payload or a value over 64 KiB")
	}
	for _, want := range []string{"KEY-END", "UUID-END", "NOTE-END", "GROUP-END", "TOPIC-END", "MDKEY-END", // behind "show all"
		"show all 54,000 characters", "show all 200,000 characters, 195.3 KiB", "-o json output has it whole",
		"976.6 KiB, the first 16.0 KiB shown", `href="/dlq/` + id + `/payload"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the dead-letter page does not show %q", want)
		}
	}

	resp, err := f.client.Get(f.srv.URL + "/dlq/" + id + "/payload")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	h := resp.Header
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, m.Payload) || h.Get("Content-Type") != "application/octet-stream" ||
		h.Get("Content-Disposition") != `attachment; filename="dead-letter-`+id+`.payload"` || h.Get("X-Content-Type-Options") != "nosniff" ||
		!strings.HasPrefix(h.Get("Content-Security-Policy"), "sandbox") {
		t.Fatalf("payload download: %d, %d bytes (want %d), headers %v", resp.StatusCode, len(body), len(m.Payload), h)
	}

	// A binary payload is not shown, and downloads byte for byte.
	bin := f.addDeadLetter(t, outbox.RejectedMessage{Payload: []byte{0xff, 0x00, '<', 'b', '>', 0xfe}})
	if _, page := f.get(t, "/dlq/"+itoa(bin)); !strings.Contains(page, "6 B of binary data, not shown") {
		t.Error("a binary payload is not said to be binary")
	}
	if _, body := f.get(t, "/dlq/"+itoa(bin)+"/payload"); body != "\xff\x00<b>\xfe" {
		t.Errorf("binary payload downloaded as %q", body)
	}
	if code, _ := f.get(t, "/dlq/999999/payload"); code != http.StatusNotFound {
		t.Errorf("the payload of no dead letter: %d, want 404", code)
	}

	// The list shows each long value cut, the whole on the entry's page.
	code, list := f.get(t, "/dlq")
	if code != http.StatusOK || len(list) > 32<<10 {
		t.Fatalf("GET /dlq: %d, %d bytes", code, len(list))
	}
	if strings.Contains(list, "UUID-END") || strings.Contains(list, "REASON-END") || !strings.Contains(list, "xxxx…") {
		t.Error("the list does not cut long values")
	}
	// The confirmation page names a long key cut, and posts it whole.
	key := longText(54_000, "KEY-END")
	_, confirm := newFixture(t, true).get(t, "/confirm/retry-held?group=billing&topic=orders&partition=0&key="+key)
	if strings.Count(confirm, "KEY-END") != 1 || !strings.Contains(confirm, `key &#34;xxxx`) {
		t.Error("the confirmation page does not name a long key cut, or does not post it whole")
	}
}

// In a real browser, at 1400×1000: the dead-letter page of a 1 MB payload
// and a 54 KB key stays about a screen high and never wider than the
// window, with every "show all" open too; the group page with a held 54 KB
// key keeps its grid in one line per partition and within the window.
func TestLongValuesKeepThePageBoundedInARealBrowser(t *testing.T) {
	f := newFixture(t, false)
	id := itoa(f.addDeadLetter(t, longDeadLetter()))
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
	if err := chromedp.Run(ctx, chromedp.Navigate(f.srv.URL+"/dlq/"+id), chromedp.WaitVisible("#payload", chromedp.ByQuery)); err != nil {
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
		if err := chromedp.Run(ctx, chromedp.Navigate(f.srv.URL+path), chromedp.WaitVisible("main h1", chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
		if s := measure(true); s.Height > 3000 || s.Width > s.Window || s.Widest > s.Window {
			t.Errorf("%s: %.0f×%.0f px (widest element to %.0f) in a window %.0f px wide", path, s.Width, s.Height, s.Widest, s.Window)
		}
	}

	// A held key of 54 KB, and a failing partition, next to the grid.
	key := longText(54_000, "KEY-END")
	f.b.Publish("orders", outboxtest.Keyed("h1", key, 1, "x"), outboxtest.Keyed("h2", key, 2, "x"), outboxtest.Keyed("ok", "short", 3, "x"))
	store, err := deadletter.NewStore(deadletter.Config{Schema: f.b.Schema, Pool: f.b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.b.HoldingConsumer("billing", "orders", store, key)
	outboxtest.WaitFor(t, "the key held", 30*time.Second, func() bool { return f.b.Rows("held") == 2 })
	f.b.Exec("UPDATE " + f.b.Schema + ".cursors SET last_error = repeat('e', 4000) WHERE group_name = 'billing'")
	if err := chromedp.Run(ctx, chromedp.Navigate(f.srv.URL+"/groups/orders/billing"), chromedp.WaitVisible("#held", chromedp.ByQuery)); err != nil {
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
	f.b.Exec("UPDATE " + f.b.Schema + ".cursors SET last_error = 'evil' || chr(8238) || 'txet ' || repeat('z', 300) WHERE group_name = 'billing' AND partition = 1")
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
