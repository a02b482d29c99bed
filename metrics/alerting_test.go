package metrics_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/metrics"
)

// promtool finds promtool on PATH. Without it the test is skipped, except
// in CI (CI=true), which installs it (.ci/run) and must run the rule tests.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("promtool is not on PATH, and CI must run the alerting rules' tests: install Debian's prometheus package (.ci/run does): %v", err)
	}
	t.Skip("promtool is not on PATH: the alerting rules' unit tests (docs/prometheus-alerts_test.yml) are not run; install it (Debian: apt-get install prometheus) to run them")
	return ""
}

// The alerting rules are valid, and each of them fires on the series of
// docs/prometheus-alerts_test.yml that should fire it, with the labels and
// the text expected, and stays quiet on those that should not.
func TestAlertingRulesPassTheirPromtoolUnitTests(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "prometheus-alerts.yml"},
		{"test", "rules", "prometheus-alerts_test.yml"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = "../docs"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s (in docs/): %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

type alertingRules struct {
	Groups []struct {
		Rules []struct {
			Alert string `yaml:"alert"`
			Expr  string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readAlertingRules(t *testing.T, path string) alertingRules {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rules alertingRules
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return rules
}

// Every alert of docs/prometheus-alerts.yml has a rule test in which it
// fires and one in which it does not: a new alert comes with its tests.
func TestEveryAlertHasARuleTestFiringAndOneQuiet(t *testing.T) {
	rules := readAlertingRules(t, "../docs/prometheus-alerts.yml")
	data, err := os.ReadFile("../docs/prometheus-alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(data, &tests); err != nil {
		t.Fatalf("prometheus-alerts_test.yml: %v", err)
	}
	if !slices.Equal(tests.RuleFiles, []string{"prometheus-alerts.yml"}) {
		t.Errorf("prometheus-alerts_test.yml tests %v, want [prometheus-alerts.yml]", tests.RuleFiles)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fires[r.Alert] {
				t.Errorf("alert %s has no rule test in which it fires", r.Alert)
			}
			if !quiet[r.Alert] {
				t.Errorf("alert %s has no rule test in which it stays quiet", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alert in docs/prometheus-alerts.yml")
	}
}

// databaseGauges are the names of the gauges every replica reads from the
// database and exports alike (not the collector's own health, which is
// each process's).
func databaseGauges(t *testing.T) []string {
	t.Helper()
	b := outboxtest.Setup(t)
	c, err := metrics.NewCollector(metrics.CollectorConfig{Pool: b.Pool, Schema: b.Schema})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc, 64)
	c.Describe(ch)
	close(ch)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	var out []string
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil && !strings.HasPrefix(m[1], "outbox_collector_") {
			out = append(out, m[1])
		}
	}
	if len(out) < 10 {
		t.Fatalf("database gauges %v: fewer than expected", out)
	}
	return out
}

// The database gauges are exported by every replica that enables metrics
// with a Pool, with the same values: an expression that sums them over
// instances counts them once per replica (two replicas showed 128 of 64
// partitions paused). Every expression of the dashboard and the alerting
// rules takes them with max or min across instances.
func TestDashboardAndAlertsTakeDatabaseGaugesOnceAcrossReplicas(t *testing.T) {
	gauges := databaseGauges(t)
	for what, exprs := range map[string][]string{
		"docs/grafana-dashboard.json": dashboardExprs(t, "../docs/grafana-dashboard.json"),
		"docs/prometheus-alerts.yml":  ruleExprs(t, "../docs/prometheus-alerts.yml"),
	} {
		for _, e := range exprs {
			for _, problem := range overInstances(e, gauges) {
				t.Errorf("%s: %s", what, problem)
			}
		}
	}
}

// The check itself: what it accepts and what it refuses.
func TestOverInstancesCheck(t *testing.T) {
	gauges := []string{"outbox_lag_messages", "outbox_lag_seconds"}
	for expr, ok := range map[string]bool{
		`max by (schema, group, topic) (outbox_lag_messages{group=~"(a|b)"})`:                          true,
		`max(outbox_lag_messages) by (group) > 0`:                                                      true,
		`min without (instance, job) (outbox_lag_seconds)`:                                             true,
		`max by (group) (deriv(outbox_lag_messages[10m])) > 0 and max by (group) (outbox_lag_seconds)`: true,
		`outbox_collector_up == 0`:                                                                     true,
		`sum by (group, topic) (outbox_lag_messages)`:                                                  false,
		`outbox_lag_seconds > 300`:                                                                     false,
		`max by (instance, group) (outbox_lag_seconds)`:                                                false,
		`sum by (group) (max by (group, topic) (outbox_lag_messages))`:                                 true,
		`max by (group) (sum by (group, instance) (outbox_lag_messages))`:                              false,
		`max by (group) (outbox_lag_seconds) and on (group) sum(outbox_lag_messages) > 0`:              false,
		`min without (job) (outbox_lag_seconds)`:                                                       false,
	} {
		if problems := overInstances(expr, gauges); (len(problems) == 0) != ok {
			t.Errorf("overInstances(%s) = %v, want ok %v", expr, problems, ok)
		}
	}
}

func dashboardExprs(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

func ruleExprs(t *testing.T, path string) []string {
	t.Helper()
	var out []string
	for _, g := range readAlertingRules(t, path).Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	return out
}

// promqlAggregators are PromQL's aggregation operators.
var promqlAggregators = map[string]bool{"sum": true, "avg": true, "count": true, "min": true, "max": true, "stddev": true,
	"stdvar": true, "topk": true, "bottomk": true, "quantile": true, "group": true, "count_values": true}

func isWordByte(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// overInstances checks how expr takes each of gauges: the innermost
// aggregation around each occurrence must be max or min, grouping by labels
// other than instance (or without instance), so that identical series of
// several instances count once. It returns what is wrong, if anything. It
// reads PromQL's parentheses and words (string literals skipped), which is
// all the dashboard and the rules need.
func overInstances(expr string, gauges []string) []string {
	// The parentheses, matched, and where the words are.
	type span struct{ open, close int }
	var (
		parens []span
		stack  []int
		words  []span // [start, end) of each word outside strings
	)
	for i := 0; i < len(expr); i++ {
		switch c := expr[i]; {
		case c == '"' || c == '\'' || c == '`':
			for i++; i < len(expr) && expr[i] != c; i++ {
				if expr[i] == '\\' && c != '`' {
					i++
				}
			}
		case c == '(':
			stack = append(stack, i)
		case c == ')':
			if len(stack) == 0 {
				return []string{fmt.Sprintf("%s: unbalanced parentheses", expr)}
			}
			parens = append(parens, span{stack[len(stack)-1], i})
			stack = stack[:len(stack)-1]
		case isWordByte(c) && (i == 0 || !isWordByte(expr[i-1])):
			j := i
			for j < len(expr) && isWordByte(expr[j]) {
				j++
			}
			words = append(words, span{i, j})
			i = j - 1
		}
	}
	if len(stack) > 0 {
		return []string{fmt.Sprintf("%s: unbalanced parentheses", expr)}
	}
	closeOf := map[int]int{} // '(' -> its ')'
	openOf := map[int]int{}  // ')' -> its '('
	for _, p := range parens {
		closeOf[p.open], openOf[p.close] = p.close, p.open
	}
	// before returns the word right before index i (spaces skipped), and
	// where it starts; "" when something else precedes.
	before := func(i int) (string, int) {
		j := i
		for j > 0 && expr[j-1] == ' ' {
			j--
		}
		k := j
		for k > 0 && isWordByte(expr[k-1]) {
			k--
		}
		return expr[k:j], k
	}
	// aggregation says whether the '(' at open holds the argument of an
	// aggregation, which one, and its by/without clause ("" for none).
	aggregation := func(open int) (agg, clause string, ok bool) {
		w, _ := before(open)
		if promqlAggregators[w] {
			// "max(x) by (a)": the clause may follow.
			rest := strings.TrimLeft(expr[closeOf[open]+1:], " ")
			for _, kw := range []string{"by", "without"} {
				if after := strings.TrimLeft(strings.TrimPrefix(rest, kw), " "); strings.HasPrefix(rest, kw) && strings.HasPrefix(after, "(") {
					start := len(expr) - len(after)
					return w, kw + " " + expr[start:closeOf[start]+1], true
				}
			}
			return w, "", true
		}
		if w != "" {
			return "", "", false // a function's call, or a clause's labels
		}
		// "max by (a) (x)": the clause came first.
		j := open
		for j > 0 && expr[j-1] == ' ' {
			j--
		}
		if j == 0 || expr[j-1] != ')' {
			return "", "", false
		}
		clauseOpen := openOf[j-1]
		kw, at := before(clauseOpen)
		if kw != "by" && kw != "without" {
			return "", "", false
		}
		if a, _ := before(at); promqlAggregators[a] {
			return a, kw + " " + expr[clauseOpen:j], true
		}
		return "", "", false
	}
	var problems []string
	for _, w := range words {
		name := expr[w.open:w.close]
		if !slices.Contains(gauges, name) {
			continue
		}
		// The parentheses around it, innermost first.
		var around []span
		for _, p := range parens {
			if p.open < w.open && w.close <= p.close {
				around = append(around, p)
			}
		}
		slices.SortFunc(around, func(a, b span) int { return b.open - a.open })
		found := false
		for _, p := range around {
			agg, clause, ok := aggregation(p.open)
			if !ok {
				continue
			}
			found = true
			labels := regexp.MustCompile(`\w+`).FindAllString(strings.TrimPrefix(strings.TrimPrefix(clause, "by "), "without "), -1)
			switch {
			case agg != "max" && agg != "min":
				problems = append(problems, fmt.Sprintf("%s: %s of %s counts each replica's identical series (take max or min across instances)", expr, agg, name))
			case strings.HasPrefix(clause, "by ") && slices.Contains(labels, "instance"):
				problems = append(problems, fmt.Sprintf("%s: %s of %s keeps one series per instance (%s)", expr, agg, name, clause))
			case strings.HasPrefix(clause, "without ") && !slices.Contains(labels, "instance"):
				problems = append(problems, fmt.Sprintf("%s: %s of %s keeps one series per instance (%s)", expr, agg, name, clause))
			}
			break
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s: %s is not aggregated: one series (an alert, a line) per replica", expr, name))
		}
	}
	return problems
}
