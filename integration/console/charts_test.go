package console

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// attr reads attribute name of the element sel selects.
func attr(t *testing.T, ctx context.Context, sel, name string) string {
	t.Helper()
	var v string
	var ok bool
	if err := chromedp.Run(ctx, chromedp.AttributeValue(sel, name, &v, &ok, chromedp.ByQuery)); err != nil {
		t.Fatalf("%s of %s: %v", name, sel, err)
	}
	return v
}

// tiles reads the class of every partition's tile on the group page.
func tiles(t *testing.T, ctx context.Context, partitions int) []string {
	t.Helper()
	out := make([]string, partitions)
	for p := range out {
		out[p] = attr(t, ctx, "#t"+strconv.Itoa(p), "class")
	}
	return out
}

// In a real browser: the group page's charts move while a subscriber works
// through a backlog, without a reload (the lag chart's line gains points
// and changes, the throughput is known), and the partition tiles follow
// the partitions' states live: no lease before the subscriber starts, ok
// while it works, held for the partition of a failing key, paused for a
// partition an operator paused. Saves docs/console-charts.png (see
// screenshot).
func TestChartsAndGridMoveInARealBrowser(t *testing.T) {
	const partitions = 6
	f := consoletest.NewWith(t, false, "", func(c *console.Config) {
		c.RefreshInterval, c.HistoryInterval, c.HistoryWindow = 250*time.Millisecond, 250*time.Millisecond, 40*time.Second
	})
	f.B.Register("payments", partitions)
	for i := range 1500 {
		f.B.Publish("payments", outboxtest.Keyed("m"+strconv.Itoa(i), "customer-"+strconv.Itoa(i%40), i, "payload"))
	}
	f.B.Publish("payments", outboxtest.Keyed("poison", "poison", 0, "payload"), outboxtest.Keyed("poison-2", "poison", 1, "payload"))
	f.B.SequenceAll()
	f.B.Exec(fmt.Sprintf("INSERT INTO %s.cursors (group_name, topic, partition) SELECT 'billing', 'payments', g FROM generate_series(0, %d) g", f.B.Schema, partitions-1))

	ctx := browser(t, false, "")
	if err := chromedp.Run(ctx, chromedp.Navigate(f.Server.URL+"/groups/payments/billing"), chromedp.WaitVisible("#charts", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	for p, class := range tiles(t, ctx, partitions) {
		if class != "tile s-no-lease" {
			t.Fatalf("partition %d before any subscriber: %q, want no lease", p, class)
		}
	}

	// A subscriber works through the backlog; the key "poison" always
	// fails and is held (key isolation) until an operator acts.
	sub := f.B.Subscriber("billing", func(c *outbox.SubscriberConfig) {
		c.DisableSequencer = true
		c.KeyIsolation.Enabled = true
		c.Tuning.BackoffBase, c.Tuning.BackoffMax = time.Hour, time.Hour
	})
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "payments")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			if m.Metadata.Get(outbox.PublishPartitionKeyMetadata) == "poison" {
				m.Nack()
				continue
			}
			time.Sleep(20 * time.Millisecond) // a slow handler: the lag goes down visibly
			m.Ack()
		}
	}()
	outboxtest.WaitFor(t, "the poison key held", 30*time.Second, func() bool { return f.B.Rows("held") > 0 })
	held := int(f.B.Int("SELECT partition FROM " + f.B.Schema + ".held LIMIT 1"))
	paused := (held + 1) % partitions
	f.B.Exec("UPDATE "+f.B.Schema+".cursors SET paused = true WHERE group_name = 'billing' AND topic = 'payments' AND partition = $1", paused)

	outboxtest.WaitFor(t, "the tiles to show each partition's state without a reload", 30*time.Second, func() bool {
		for p, class := range tiles(t, ctx, partitions) {
			want := "tile s-ok"
			switch p {
			case held:
				want = "tile s-held"
			case paused:
				want = "tile s-paused"
			}
			if class != want {
				return false
			}
		}
		return true
	})
	if title := attr(t, ctx, "#t"+strconv.Itoa(held), "title"); title != "partition "+strconv.Itoa(held)+": 1 keys held" {
		t.Errorf("held tile's title %q", title)
	}
	if n := text(t, ctx, "#legend li.s-held b"); n != "1" {
		t.Errorf("legend counts %s held partitions, want 1", n)
	}

	// The lag chart moves: more points, another line, while the lag goes
	// down; the throughput is known.
	points := func() int {
		n, _ := strconv.Atoi(attr(t, ctx, "#chart-lag path.line", "data-points"))
		return n
	}
	before, line := points(), attr(t, ctx, "#chart-lag path.line", "d")
	outboxtest.WaitFor(t, "the lag chart to gain points without a reload", 30*time.Second, func() bool {
		return points() >= before+4 && attr(t, ctx, "#chart-lag path.line", "d") != line
	})
	outboxtest.WaitFor(t, "a throughput above 0", 30*time.Second, func() bool {
		v, err := strconv.ParseFloat(strings.TrimSuffix(text(t, ctx, "#chart-throughput [data-c=now]"), "k"), 64)
		return err == nil && v > 0
	})
	outboxtest.WaitFor(t, "ten seconds of history on the chart", 30*time.Second, func() bool { return points() >= 40 })
	lag, err := strconv.Atoi(text(t, ctx, "#lag"))
	if err != nil || lag == 0 {
		t.Fatalf("lag %q (%v): the backlog ran out before the charts were seen to move", text(t, ctx, "#lag"), err)
	}
	screenshot(t, ctx, "charts")
}
