package console_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/internal/consoletest"
)

// history is what GET /api/history answers.
type history struct {
	Samples []struct {
		Lag        int64    `json:"lag"`
		Throughput *float64 `json:"throughput"`
	} `json:"samples"`
	Charts []struct {
		ID     string `json:"id"`
		D      string `json:"d"`
		Points int    `json:"points"`
	} `json:"charts"`
}

func getHistory(t *testing.T, f *consoletest.Fixture, query string) (int, history) {
	t.Helper()
	code, body := f.Get(t, "/api/history?"+query)
	var h history
	if code == http.StatusOK {
		if err := json.Unmarshal([]byte(body), &h); err != nil {
			t.Fatalf("history %q: %v", body, err)
		}
	}
	return code, h
}

// The history API samples a group when a sample is due and answers its
// samples and charts: the lag as read, the throughput from how far the
// cursors moved. It names one group on one topic, and knows no other.
func TestHistoryAPI(t *testing.T) {
	f := consoletest.NewWith(t, false, "", func(c *console.Config) { c.HistoryInterval, c.HistoryWindow = 100*time.Millisecond, time.Minute })
	f.B.PublishN("orders", 40, "m")
	f.B.SequenceAll()
	f.B.Exec("INSERT INTO " + f.B.Schema + ".cursors (group_name, topic, partition) VALUES ('billing', 'orders', 0), ('billing', 'orders', 1)")

	for query, want := range map[string]int{"": http.StatusBadRequest, "topic=orders": http.StatusBadRequest,
		"topic=orders&group=nobody": http.StatusNotFound, "topic=nothing&group=billing": http.StatusNotFound} {
		if code, _ := getHistory(t, f, query); code != want {
			t.Errorf("GET /api/history?%s: %d, want %d", query, code, want)
		}
	}
	code, first := getHistory(t, f, "topic=orders&group=billing")
	if code != http.StatusOK || len(first.Samples) != 1 || first.Samples[0].Lag != 40 || first.Samples[0].Throughput != nil {
		t.Fatalf("first history (%d): %+v, want one sample of lag 40, throughput unknown", code, first)
	}
	if _, again := getHistory(t, f, "topic=orders&group=billing"); len(again.Samples) != 1 {
		t.Fatalf("sampled again within the interval: %d samples", len(again.Samples))
	}
	f.B.Exec("UPDATE " + f.B.Schema + ".cursors SET seq = seq + 5 WHERE group_name = 'billing'")
	time.Sleep(150 * time.Millisecond)
	_, second := getHistory(t, f, "topic=orders&group=billing")
	if len(second.Samples) != 2 || second.Samples[1].Lag != 30 || second.Samples[1].Throughput == nil || *second.Samples[1].Throughput <= 0 {
		t.Fatalf("second history: %+v, want lag 30 and a throughput", second)
	}
	if len(second.Charts) != 3 || second.Charts[0].ID != "lag" || second.Charts[0].Points != 2 || second.Charts[0].D == first.Charts[0].D {
		t.Fatalf("charts %+v after %+v: the lag chart should have moved to two points", second.Charts, first.Charts)
	}
}

// The group page draws the charts and the partition grid by state; every
// name in them is escaped text.
func TestGroupPageChartsAndGrid(t *testing.T) {
	f := consoletest.New(t, false)
	group := "g-" + consoletest.Hostile
	f.B.Exec("INSERT INTO "+f.B.Schema+".cursors (group_name, topic, partition, paused) VALUES ($1, 'orders', 0, false), ($1, 'orders', 1, true)", group)
	code, body := f.Get(t, "/groups/orders/"+url.PathEscape(group))
	if code != http.StatusOK {
		t.Fatalf("group page: %d\n%s", code, body)
	}
	if strings.Contains(body, "<script>window") || strings.Contains(body, "<img src=x") {
		t.Fatal("the group's name is rendered as markup")
	}
	for _, want := range []string{
		`<figure class="chart" id="chart-lag">`, `<figure class="chart" id="chart-throughput">`,
		`<title>Lag (messages) of consumer group g-&lt;script&gt;`,
		`<a class="tile s-no-lease" id="t0" href="#p0" title="partition 0: no lease">0</a>`,
		`<a class="tile s-paused" id="t1" href="#p1" title="partition 1: paused">1</a>`,
		`<tr id="p1" class="s-paused">`, `<li class="s-ok none" data-s="ok"><i class="swatch"></i>ok <b>0</b></li>`,
		`<li class="s-paused" data-s="paused"><i class="swatch"></i>paused <b>1</b></li>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("group page lacks %s", want)
		}
	}
	code, h := getHistory(t, f, "topic=orders&group="+url.QueryEscape(group))
	if code != http.StatusOK || len(h.Samples) != 1 {
		t.Fatalf("history of the group the page showed: %d %+v", code, h)
	}
	_, raw := f.Get(t, "/api/history?topic=orders&group="+url.QueryEscape(group))
	if strings.Contains(raw, "<script>") {
		t.Fatal("the history API writes a name as markup")
	}
}
