package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// In a real browser, the sources page of two databases with the same
// schema shows both side by side and their total; following a source's
// name opens its own console, under the mount prefix, with its topic.
func TestSourcesPageInARealBrowser(t *testing.T) {
	eu := outboxtest.Shard(t, "shop")
	eu.Register("orders-eu", 3)
	eu.PublishN("orders-eu", 4, "eu-")
	us := outboxtest.Shard(t, "shop")
	us.Register("payments-us", 2)
	us.PublishN("payments-us", 2, "us-")
	s, err := console.NewSources(console.SourcesConfig{Sources: []console.Source{
		{Name: "eu", Pool: eu.Pool, Schema: "shop"}, {Name: "us", Pool: us.Pool, Schema: "shop"}},
		Console: console.Config{Prefix: "/ops"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", s))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	ctx := browser(t, false, "")
	if err := chromedp.Run(ctx, chromedp.Navigate(srv.URL+"/ops/"), chromedp.WaitVisible("#total", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	for sel, want := range map[string]string{
		"#source-eu a.source-link":            "eu",
		`#source-eu [data-f="state"]`:         "reachable",
		`#source-eu [data-f="partitions"]`:    "3",
		`#source-eu [data-f="pending"]`:       "4",
		"#source-us a.source-link":            "us",
		`#source-us [data-f="partitions"]`:    "2",
		`#source-us [data-f="pending"]`:       "2",
		`#total [data-f="state"]`:             "all 2 sources reachable",
		`#total [data-f="topics"]`:            "2",
		`#total [data-f="partitions"]`:        "5",
		`#total [data-f="pending"]`:           "6",
		`#sources tbody tr:nth-child(1) td a`: "eu", // side by side, in the configuration's order
		`#sources tbody tr:nth-child(2) td a`: "us",
	} {
		if got := text(t, ctx, sel); got != want {
			t.Errorf("%s: %q, want %q", sel, got, want)
		}
	}
	screenshot(t, ctx, "sources")

	if err := chromedp.Run(ctx, chromedp.Click("#source-us a.source-link", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	var path string
	outboxtest.WaitFor(t, "us's console", 30*time.Second, func() bool {
		err := chromedp.Run(ctx, chromedp.Evaluate(`document.readyState === "complete" ? location.pathname : ""`, &path))
		return err == nil && path == "/ops/sources/us/"
	})
	if err := chromedp.Run(ctx, chromedp.WaitVisible("section.topic", chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	if main := text(t, ctx, "main"); !strings.Contains(main, "Topic payments-us") || strings.Contains(main, "orders-eu") {
		t.Errorf("us's console shows:\n%s", main)
	}
}
