package console

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// missingBrowser says what to do when no Chromium is on PATH, and whether
// that fails the test.
type missingBrowser struct {
	required bool
	text     string
}

// findBrowser reports whether Chromium (or Chrome) is on PATH. Without it
// the browser tests are skipped with a line saying how to run them, so that
// a contributor without a browser can run go test ./...; under CI=true or
// OUTBOX_REQUIRE_BROWSER=1 a missing browser is a failure, so that CI (which
// installs Chromium, .ci/run) keeps proving the console in a real browser.
func findBrowser(lookPath func(string) (string, error), getenv func(string) string) (bool, missingBrowser) {
	for _, name := range []string{"chromium", "google-chrome"} {
		if _, err := lookPath(name); err == nil {
			return true, missingBrowser{}
		}
	}
	if getenv("CI") == "true" || getenv("OUTBOX_REQUIRE_BROWSER") == "1" {
		return false, missingBrowser{required: true, text: "the browser tests need Chromium and CI=true or OUTBOX_REQUIRE_BROWSER=1 requires them: apt-get install chromium (.ci/run installs it)"}
	}
	return false, missingBrowser{text: "SKIPPED: the console's browser tests need Chromium on PATH (Debian: apt-get install chromium); install it and run go test ./integration/console, or set OUTBOX_REQUIRE_BROWSER=1 to make its absence a failure"}
}

// browser starts a headless Chromium for the test: Debian's chromium
// package, which .ci/run installs. With authorized, every request carries
// the console token.
func browser(t *testing.T, authorized bool, token string) context.Context {
	t.Helper()
	if found, msg := findBrowser(exec.LookPath, os.Getenv); !found {
		if msg.required {
			t.Fatal(msg.text)
		}
		t.Skip(msg.text)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 1000))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	if err := chromedp.Run(ctx, network.Enable()); err != nil {
		t.Fatal(err)
	}
	if authorized {
		if err := chromedp.Run(ctx, network.SetExtraHTTPHeaders(network.Headers{"Authorization": "Bearer " + token})); err != nil {
			t.Fatal(err)
		}
	}
	return ctx
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	var s string
	if err := chromedp.Run(ctx, chromedp.Text(sel, &s, chromedp.ByQuery)); err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// screenshot saves the page to $OUTBOX_CONSOLE_SCREENSHOTS/console-name.png
// when that directory is set, a relative one taken from the repository's
// root (two levels above this package), so that the command that made
// docs/console-*.png works from anywhere in the repository:
//
//	OUTBOX_CONSOLE_SCREENSHOTS=docs go test -count=1 -run 'TestConsoleInARealBrowser|TestChartsAndGridMoveInARealBrowser' ./integration/console
func screenshot(t *testing.T, ctx context.Context, name string) {
	dir := os.Getenv("OUTBOX_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join("..", "..", dir)
	}
	var png []byte
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "console-"+name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// In a real browser: the grid shows the lag going down while a subscriber
// works, without reloading; pausing from the page shows the partitions
// paused and the subscriber stops; a dead letter with a hostile payload
// renders as text and replays from the page back into the stream; an
// action without the token is refused.
func TestConsoleInARealBrowser(t *testing.T) {
	// Samples every 250 ms, so that the grid's screenshot shows the charts
	// of the few seconds it waits.
	f := consoletest.NewWith(t, true, "", func(c *console.Config) { c.HistoryInterval, c.HistoryWindow = 250*time.Millisecond, time.Minute })
	for i := range 300 {
		f.B.Publish("orders", outboxtest.Keyed("m"+strconv.Itoa(i), "k"+strconv.Itoa(i%7), i, "payload"))
	}
	f.B.SequenceAll()
	gate := make(chan struct{})
	var handled atomic.Int64
	sub := f.B.Subscriber("billing", func(c *outbox.SubscriberConfig) {
		c.DisableSequencer = true
	})
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		<-gate
		for m := range msgs {
			time.Sleep(10 * time.Millisecond) // a slow handler: the lag goes down visibly
			handled.Add(1)
			m.Ack()
		}
	}()
	outboxtest.WaitFor(t, "the group's cursors", 30*time.Second, func() bool {
		return f.B.Int("SELECT count(*) FROM "+f.B.Schema+".cursors WHERE group_name = 'billing'") == 2
	})

	ctx := browser(t, true, f.Token)
	if err := chromedp.Run(ctx, chromedp.Navigate(f.Server.URL+"/groups/orders/billing"), chromedp.WaitVisible("#grid", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	before, _ := strconv.Atoi(text(t, ctx, "#lag"))
	if before != 300 {
		t.Fatalf("lag %d before the subscriber works, want 300", before)
	}
	close(gate)
	outboxtest.WaitFor(t, "the grid's lag to go down without a reload", 30*time.Second, func() bool {
		lag, err := strconv.Atoi(text(t, ctx, "#lag"))
		return err == nil && lag < before && lag > 0
	})
	screenshot(t, ctx, "grid")

	// Pause from the page.
	if err := chromedp.Run(ctx, chromedp.Click("#pause-all", chromedp.ByQuery), chromedp.WaitVisible("#question", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	if q := text(t, ctx, "#question"); !strings.Contains(q, `Pause every partition of consumer group "billing" on topic "orders"`) {
		t.Fatalf("confirmation: %q", q)
	}
	screenshot(t, ctx, "confirm")
	if n := f.B.Int("SELECT count(*) FROM " + f.B.Schema + ".cursors WHERE group_name = 'billing' AND paused"); n != 0 {
		t.Fatal("pause happened before it was confirmed")
	}
	if err := chromedp.Run(ctx, chromedp.Click("#confirm", chromedp.ByQuery), chromedp.WaitVisible("#flash", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	if flash := text(t, ctx, "#flash"); !strings.Contains(flash, "paused 2 partition") {
		t.Fatalf("flash after pause: %q", flash)
	}
	outboxtest.WaitFor(t, "both partitions shown paused", 30*time.Second, func() bool {
		return strings.Contains(text(t, ctx, "#p0 [data-f=state]"), "paused") && strings.Contains(text(t, ctx, "#p1 [data-f=state]"), "paused")
	})
	outboxtest.WaitFor(t, "the subscriber to stop", 30*time.Second, func() bool {
		n := handled.Load()
		time.Sleep(time.Second)
		return handled.Load() == n
	})
	stopped := handled.Load()
	if stopped >= 300 {
		t.Fatal("everything was consumed before the pause took effect: the test proves nothing")
	}
	time.Sleep(time.Second)
	if handled.Load() != stopped {
		t.Fatalf("the subscriber went on after the pause: %d -> %d", stopped, handled.Load())
	}

	// The hostile dead letter renders as text, and replays.
	if err := chromedp.Run(ctx, chromedp.Navigate(f.Server.URL+"/dlq"), chromedp.WaitVisible("#dead-letters", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, "dead-letters")
	if err := chromedp.Run(ctx, chromedp.Click("#entry-"+consoletest.Itoa(f.Entry), chromedp.ByQuery), chromedp.WaitVisible("#payload", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	var pwned bool
	if err := chromedp.Run(ctx, chromedp.Evaluate(`window.__pwned === 1`, &pwned)); err != nil {
		t.Fatal(err)
	}
	if pwned {
		t.Fatal("the hostile payload executed")
	}
	if payload := text(t, ctx, "#payload"); payload != consoletest.Hostile {
		t.Fatalf("payload shown as %q, want the text %q", payload, consoletest.Hostile)
	}
	screenshot(t, ctx, "dead-letter")
	pendingBefore := f.B.Int("SELECT count(*) FROM " + f.B.Schema + ".pending")
	if err := chromedp.Run(ctx, chromedp.Click("#replay", chromedp.ByQuery), chromedp.WaitVisible("#confirm", chromedp.ByQuery),
		chromedp.Click("#confirm", chromedp.ByQuery), chromedp.WaitVisible("#flash", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	if status := text(t, ctx, "#status"); status != "replayed" {
		t.Fatalf("status after replay: %q", status)
	}
	if n := f.B.Int("SELECT count(*) FROM " + f.B.Schema + ".pending"); n != pendingBefore+1 {
		t.Fatalf("replay put %d messages back in the stream, want 1", n-pendingBefore)
	}

	// Without the token, an action is refused and changes nothing.
	anon := browser(t, false, "")
	if err := chromedp.Run(anon, chromedp.Navigate(f.Server.URL+"/groups/orders/billing"), chromedp.WaitVisible("#grid", chromedp.ByQuery),
		chromedp.Click("#resume-0", chromedp.ByQuery), chromedp.WaitVisible("#confirm", chromedp.ByQuery),
		chromedp.Click("#confirm", chromedp.ByQuery), chromedp.WaitVisible("#error", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "the refusal of an action without the token", 30*time.Second, func() bool {
		var e string
		err := chromedp.Run(anon, chromedp.Text("#error", &e, chromedp.ByQuery))
		return err == nil && strings.Contains(e, "need the console token")
	})
	if n := f.B.Int("SELECT count(*) FROM " + f.B.Schema + ".cursors WHERE group_name = 'billing' AND paused"); n != 2 {
		t.Fatalf("an unauthorized resume changed %d partitions", 2-n)
	}
	if err := chromedp.Run(ctx, chromedp.Navigate(f.Server.URL+"/"), chromedp.WaitVisible("section.topic", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, "overview")
}
