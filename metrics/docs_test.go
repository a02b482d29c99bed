package metrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/metrics"
)

// recording is a Registerer that keeps what is registered on it.
type recording struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recording) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registry.Register(c)
}

// exported is every metric name Enable registers (with the collector).
func exported(t *testing.T) map[string]bool {
	t.Helper()
	b := outboxtest.Setup(t)
	reg := &recording{Registry: prometheus.NewRegistry()}
	m, err := metrics.Enable(metrics.Config{Registerer: reg, Pool: b.Pool, Schema: b.Schema})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Disable()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for _, c := range reg.collectors {
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	return names
}

var metricName = regexp.MustCompile(`\boutbox_[a-z_]+`)

// referenced are the outbox metric names in exprs, histogram suffixes
// removed.
func referenced(exprs []string) []string {
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricName.FindAllString(e, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				n = strings.TrimSuffix(n, suffix)
			}
			seen[n] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// The Grafana dashboard, the alerting rules and docs/observability.md use
// only metrics the outbox exports, and the documentation lists every one.
func TestDashboardAlertsAndDocsMatchTheExportedMetrics(t *testing.T) {
	names := exported(t)

	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	data, err := os.ReadFile("../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	var dashExprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			dashExprs = append(dashExprs, tg.Expr)
		}
	}

	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	data, err = os.ReadFile("../docs/prometheus-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatalf("prometheus-alerts.yml: %v", err)
	}
	var ruleExprs []string
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			ruleExprs = append(ruleExprs, r.Expr)
			alerts[r.Alert] = true
		}
	}
	for _, want := range []string{"OutboxLagGrowing", "OutboxPartitionStalled", "OutboxDeadLettersGrowing", "OutboxOldestPendingTooOld", "OutboxNoLiveMember"} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}

	doc, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	// What an alert fires on, and the gauges an operator reads an alert
	// with, each have a panel: a page names a metric the dashboard shows.
	onDashboard := map[string]bool{}
	for _, n := range referenced(dashExprs) {
		onDashboard[n] = true
	}
	for _, n := range append(referenced(ruleExprs), "outbox_held_keys", "outbox_held_messages", "outbox_partitions_isolation_full",
		"outbox_delayed_messages", "outbox_pending_messages") {
		if !onDashboard[n] {
			t.Errorf("%s (used by an alert, or read beside one) has no panel on the dashboard", n)
		}
	}
	for what, exprs := range map[string][]string{"the dashboard": dashExprs, "the alerting rules": ruleExprs} {
		for _, n := range referenced(exprs) {
			if !names[n] {
				t.Errorf("%s uses %s, which the outbox does not export", what, n)
			}
		}
	}
	for n := range names {
		if !strings.Contains(string(doc), "`"+n+"`") {
			t.Errorf("docs/observability.md does not document %s", n)
		}
	}
	for _, n := range referenced([]string{string(doc)}) {
		if !names[n] {
			t.Errorf("docs/observability.md names %s, which the outbox does not export", n)
		}
	}
}
