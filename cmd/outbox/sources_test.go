package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// shards is a sharded application's databases for the CLI: each a
// database of its own with the same outbox schema, its connection string
// in the environment variable OUTBOX_<NAME>_DATABASE_URL, and the --config
// file naming them.
type shards struct {
	t      *testing.T
	env    map[string]string
	config string
	db     map[string]*outboxtest.Bundle
}

const shardSchema = "shop_outbox"

func newShards(t *testing.T, names ...string) *shards {
	t.Helper()
	s := &shards{t: t, env: map[string]string{}, db: map[string]*outboxtest.Bundle{}}
	var file strings.Builder
	file.WriteString("sources:\n")
	for _, name := range names {
		b := outboxtest.Shard(t, shardSchema)
		b.Register("orders", 2)
		s.db[name] = b
		env := "OUTBOX_" + strings.ToUpper(name) + "_DATABASE_URL"
		s.env[env] = b.Pool.Config().ConnString()
		file.WriteString("  - name: " + name + "\n    database_url_env: " + env + "\n    schema: " + shardSchema + "\n")
	}
	s.config = s.write("pipeline.yaml", file.String())
	return s
}

// write writes a file of the test's and returns its path.
func (s *shards) write(name, content string) string {
	path := filepath.Join(s.t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return path
}

// run runs the command with the shards' environment (and nothing else:
// no DATABASE_URL) until ctx ends.
func (s *shards) runCtx(ctx context.Context, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := execute(ctx, args, strings.NewReader(""), &out, &errOut, func(k string) string { return s.env[k] })
	// A connection string (and its password) is never printed.
	for _, url := range s.env {
		if strings.Contains(out.String()+errOut.String(), url) {
			s.t.Fatalf("outbox %s printed a connection string:\n%s\n%s", strings.Join(args, " "), out.String(), errOut.String())
		}
	}
	return code, out.String(), errOut.String()
}

// start runs a long-running command (relay, serve) with the shards'
// environment until stop, which interrupts it and returns its exit code;
// its stderr can be read meanwhile. It fails the test when the command
// prints a connection string or does not stop.
func (s *shards) start(args ...string) (stderr *syncBuffer, stop func() int) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	stderr = &syncBuffer{}
	go func() {
		done <- execute(ctx, args, strings.NewReader(""), io.Discard, stderr, func(k string) string { return s.env[k] })
	}()
	s.t.Cleanup(cancel)
	return stderr, func() int {
		s.t.Helper()
		cancel()
		select {
		case code := <-done:
			for _, url := range s.env {
				if strings.Contains(stderr.String(), url) {
					s.t.Fatalf("outbox %s printed a connection string: %s", args[0], stderr.String())
				}
			}
			return code
		case <-time.After(30 * time.Second):
			s.t.Fatalf("outbox %s did not stop when interrupted", args[0])
			return -1
		}
	}
}

func (s *shards) run(args ...string) (int, string, string) {
	s.t.Helper()
	return s.runCtx(outboxtest.Ctx(s.t), args...)
}

// Several databases configured in a file: migrate and status act on every
// source, side by side, with a total; a command that acts on one needs
// --source, and acts on that one only.
func TestCommandsOverSeveralSources(t *testing.T) {
	s := newShards(t, "eu", "us")
	s.db["eu"].PublishN("orders", 3, "eu")
	s.db["us"].PublishN("orders", 5, "us")

	code, out, errOut := s.run("migrate", "--config", s.config)
	if code != exitOK || !regexp.MustCompile(`(?m)^eu\s+shop_outbox\s+\d+\s+\d+\s+up to date$`).MatchString(out) || !strings.Contains(out, "us ") {
		t.Fatalf("migrate --config: exit %d\n%s%s", code, out, errOut)
	}

	code, out, errOut = s.run("status", "--config", s.config)
	if code != exitOK {
		t.Fatalf("status --config: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{`(?m)^eu\s+shop_outbox\s+1\s+2\s+3\s+`, `(?m)^us\s+shop_outbox\s+1\s+2\s+5\s+`, `(?m)^TOTAL\s+2\s+4\s+8\s+`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("status --config: no line %s in\n%s", want, out)
		}
	}
	var rep sourcesReport
	code, out, _ = s.run("status", "--config", s.config, "-o", "json")
	if err := json.Unmarshal([]byte(out), &rep); code != exitOK || err != nil {
		t.Fatalf("status -o json: exit %d, %v\n%s", code, err, out)
	}
	if len(rep.Sources) != 2 || rep.Sources[0].Name != "eu" || rep.Sources[0].Pending != 3 || rep.Total.Pending != 8 || rep.Unreachable != 0 {
		t.Fatalf("status -o json: %+v", rep)
	}

	// One source: --source, else a usage error naming the sources.
	for _, b := range s.db {
		b.Exec("INSERT INTO " + shardSchema + ".cursors (group_name, topic, partition, seq) SELECT 'g', topic, partition, 0 FROM " + shardSchema + ".partitions")
	}
	if code, _, e := s.run("pause", "--config", s.config, "--group", "g", "--topic", "orders"); code != exitUsage || !strings.Contains(e, "--source NAME") || !strings.Contains(e, "eu, us") {
		t.Fatalf("pause over two sources without --source: exit %d, %s", code, e)
	}
	if code, out, e := s.run("pause", "--config", s.config, "--source", "us", "--group", "g", "--topic", "orders"); code != exitOK {
		t.Fatalf("pause --source us: exit %d\n%s%s", code, out, e)
	}
	if n := s.db["us"].Int("SELECT count(*) FROM " + shardSchema + ".cursors WHERE group_name = 'g' AND paused"); n != 2 {
		t.Errorf("us: %d partitions of g paused, want 2", n)
	}
	if n := s.db["eu"].Int("SELECT count(*) FROM " + shardSchema + ".cursors WHERE group_name = 'g' AND paused"); n != 0 {
		t.Errorf("eu: pause --source us paused %d of eu's partitions", n)
	}
	if code, out, e := s.run("status", "--config", s.config, "--source", "eu"); code != exitOK || !strings.Contains(out, "topic orders: 2 partitions, 0 sequenced, 3 pending") {
		t.Fatalf("status --source eu: exit %d\n%s%s", code, out, e)
	}
	// The same sources from flags.
	if code, out, e := s.run("status", "--source-env", "eu=OUTBOX_EU_DATABASE_URL", "--source-env", "us=OUTBOX_US_DATABASE_URL", "--schema", shardSchema); code != exitOK || !regexp.MustCompile(`(?m)^TOTAL\s+2\s+4\s+8\s+`).MatchString(out) {
		t.Fatalf("status --source-env ×2: exit %d\n%s%s", code, out, e)
	}
}

// A source whose database does not answer is shown so, beside the others,
// left out of the total (which says so), and the exit code is 1.
func TestStatusShowsAnUnreachableSourceAndLeavesItOutOfTheTotal(t *testing.T) {
	s := newShards(t, "eu")
	s.db["eu"].PublishN("orders", 3, "eu")
	s.env["OUTBOX_US_DATABASE_URL"] = "postgres://outbox:secret-password@127.0.0.1:1/none?connect_timeout=1"
	config := s.write("two.yaml", "sources:\n  - name: eu\n    database_url_env: OUTBOX_EU_DATABASE_URL\n    schema: shop_outbox\n  - name: us\n    database_url_env: OUTBOX_US_DATABASE_URL\n")
	code, out, errOut := s.run("status", "--config", config)
	if code != exitError || !regexp.MustCompile(`(?m)^us\s+watermill_outbox(\s+-){10}\s*$`).MatchString(out) || !regexp.MustCompile(`(?m)^us: UNREACHABLE: `).MatchString(out) ||
		!regexp.MustCompile(`(?m)^TOTAL of 1 \(1 unreachable, not counted\)\s+1\s+2\s+3\s+`).MatchString(out) || !strings.Contains(errOut, "1 of 2 sources failed: us") {
		t.Fatalf("status with us down: exit %d\n%s%s", code, out, errOut)
	}
	if strings.Contains(out+errOut, "secret-password") {
		t.Fatalf("the password of us was printed:\n%s%s", out, errOut)
	}
	// Aligned: every row's TOPICS column starts under the header's.
	lines := strings.Split(out, "\n")
	col := strings.Index(lines[0], "TOPICS")
	for _, l := range lines[1:4] {
		if col < 1 || len(l) <= col || l[col] == ' ' || l[col-1] != ' ' {
			t.Fatalf("the row %q does not start its TOPICS column at %d, under the header:\n%s", l, col, out)
		}
	}
}

// What the configuration refuses, as usage errors that say what to do.
func TestSourceConfigurationErrors(t *testing.T) {
	s := newShards(t, "eu")
	for name, c := range map[string]struct {
		file string
		args []string
		want string
	}{
		"a connection string in the file": {"sources:\n  - name: eu\n    database_url: postgres://x\n", nil, "field database_url not found"},
		"a name twice":                    {"sources:\n  - {name: eu, database_url_env: OUTBOX_EU_DATABASE_URL}\n  - {name: eu, database_url_env: OUTBOX_EU_DATABASE_URL}\n", nil, "source eu is configured twice"},
		"a bad name":                      {"sources:\n  - {name: eu/1, database_url_env: OUTBOX_EU_DATABASE_URL}\n", nil, `invalid source name "eu/1"`},
		"an empty variable":               {"sources:\n  - {name: eu, database_url_env: OUTBOX_NOPE}\n", nil, "$OUTBOX_NOPE is empty"},
		"no variable":                     {"sources:\n  - {name: eu}\n", nil, "no database_url_env"},
		"an unknown --source":             {"sources:\n  - {name: eu, database_url_env: OUTBOX_EU_DATABASE_URL}\n", []string{"--source", "us"}, "--source us: not one of the configured sources (eu)"},
		"sources and --database-url":      {"sources:\n  - {name: eu, database_url_env: OUTBOX_EU_DATABASE_URL}\n", []string{"--database-url", "postgres://x"}, "exclude each other"},
		"--source-env without a variable": {"", []string{"--source-env", "eu"}, "want NAME=ENV_VAR"},
		"a file of 2 MiB":                 {"sources: []\n#" + strings.Repeat("x", 2<<20), nil, "larger than 1024 KiB"},
	} {
		args := append([]string{"status"}, c.args...)
		if c.file != "" {
			args = append(args, "--config", s.write("c.yaml", c.file))
		}
		if code, _, e := s.run(args...); code != exitUsage || !strings.Contains(e, c.want) {
			t.Errorf("%s: exit %d, %s; want a usage error saying %q", name, code, e, c.want)
		}
	}
	if code, _, e := s.run("status", "--config", filepath.Join(t.TempDir(), "missing.yaml")); code != exitUsage || !strings.Contains(e, "--config") {
		t.Errorf("a missing file: exit %d, %s", code, e)
	}
}

// outbox pipeline --config runs a pipeline per source (here: sequencers) and
// exports each source's figures and outbox_source_up on --metrics-listen.
func TestRelayRunsEverySourceAndExportsTheirMetrics(t *testing.T) {
	s := newShards(t, "eu", "us")
	s.db["eu"].PublishN("orders", 3, "eu")
	s.db["us"].PublishN("orders", 4, "us")
	errOut, stop := s.start("pipeline", "--config", s.config, "--metrics-listen", "127.0.0.1:0")
	outboxtest.WaitFor(t, "both sources sequenced", 30*time.Second, func() bool {
		return s.db["eu"].Rows("log") == 3 && s.db["us"].Rows("log") == 4
	})
	var page string
	outboxtest.WaitFor(t, "the metrics page to show both sources up", 30*time.Second, func() bool {
		page = scrape(errOut.String())
		return strings.Contains(page, `outbox_source_up{source="eu"} 1`) && strings.Contains(page, `outbox_source_up{source="us"} 1`)
	})
	if !strings.Contains(page, `outbox_collector_up{schema="shop_outbox",source="us"} 1`) {
		t.Errorf("no collector of us on the metrics page:\n%s", page)
	}
	if code := stop(); code != exitOK || !strings.Contains(errOut.String(), "pipeline running on 2 sources (eu, us)") {
		t.Fatalf("relay exited %d: %s", code, errOut.String())
	}
}

// scrape reads the metrics page whose address the relay noted in
// stderr ("" until it did).
func scrape(stderr string) string {
	m := regexp.MustCompile(`metrics on (http://\S+/metrics)`).FindStringSubmatch(stderr)
	if m == nil {
		return ""
	}
	resp, err := http.Get(m[1])
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// outbox serve --config serves the sources page: every source side by
// side with a total, each one's console under /sources/NAME/.
func TestServeShowsEverySource(t *testing.T) {
	s := newShards(t, "eu", "us")
	s.db["eu"].PublishN("orders", 3, "eu")
	s.db["us"].PublishN("orders", 4, "us")
	errOut, stop := s.start("serve", "--config", s.config, "--listen", "127.0.0.1:0")
	var body string
	outboxtest.WaitFor(t, "the sources page", 30*time.Second, func() bool {
		m := regexp.MustCompile(`console on (http://\S+/)`).FindStringSubmatch(errOut.String())
		if m == nil {
			return false
		}
		resp, err := http.Get(m[1] + "api/sources")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	})
	var page struct {
		Sources []struct{ Name string }
		Total   struct{ Pending int64 }
	}
	if err := json.Unmarshal([]byte(body), &page); err != nil || len(page.Sources) != 2 || page.Sources[0].Name != "eu" || page.Total.Pending != 7 {
		t.Fatalf("/api/sources: %v\n%s", err, body)
	}
	if code := stop(); code != exitOK {
		t.Fatalf("serve exited %d: %s", code, errOut.String())
	}
}

// status --watch over several sources reads them again every interval on
// the pools it opened first: connections stay as they are (before, each
// round opened new pools, never closed until the command ended).
func TestStatusWatchOverSourcesReusesItsPools(t *testing.T) {
	s := newShards(t, "eu", "us")
	for env, url := range s.env {
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		s.env[env] = url + sep + "application_name=outbox-watch-test"
	}
	_, stop := s.start("status", "--config", s.config, "--watch", "50ms")
	time.Sleep(1500 * time.Millisecond) // about 30 rounds
	n := s.db["eu"].Int("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-watch-test'")
	if code := stop(); code != exitOK {
		t.Fatalf("status --watch exited %d", code)
	}
	if n == 0 || n > 8 {
		t.Fatalf("%d connections of status --watch to the server after 30 rounds over 2 sources; want a pool's worth per source", n)
	}
}
