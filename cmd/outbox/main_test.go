package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// cli runs the command against the test database and schema.
type cli struct {
	t      *testing.T
	url    string
	schema string
}

func newCLI(t *testing.T, schema string) cli { return cli{t: t, url: pgtest.URL(t), schema: schema} }

// run runs args (with --schema) and returns the exit code and outputs;
// stdin answers confirmations.
func (c cli) run(stdin string, args ...string) (int, string, string) {
	c.t.Helper()
	var out, errOut bytes.Buffer
	env := func(k string) string {
		if k == "DATABASE_URL" {
			return c.url
		}
		return ""
	}
	code := execute(outboxtest.Ctx(c.t), append(args, "--schema", c.schema), strings.NewReader(stdin), &out, &errOut, env)
	return code, out.String(), errOut.String()
}

// ok runs args and fails the test unless it exits 0.
func (c cli) ok(args ...string) string {
	c.t.Helper()
	code, out, errOut := c.run("", args...)
	if code != exitOK {
		c.t.Fatalf("outbox %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func (c cli) json(v any, args ...string) {
	c.t.Helper()
	out := c.ok(append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		c.t.Fatalf("outbox %s -o json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestMigrateDryRunStatusAndApply(t *testing.T) {
	c := newCLI(t, pgtest.Schema(t))
	var st struct {
		Database, Release int
		State             string
	}
	c.json(&st, "migrate", "status")
	if st.Database != 0 || st.Release != outbox.SchemaVersion || !strings.Contains(st.State, "not migrated") {
		t.Fatalf("status before: %+v", st)
	}
	sql := c.ok("migrate", "--dry-run")
	if !strings.Contains(sql, "CREATE TABLE") || !strings.Contains(sql, `"`+c.schema+`".cursors`) {
		t.Fatalf("dry run printed no DDL:\n%s", sql)
	}
	c.json(&st, "migrate", "status")
	if st.Database != 0 {
		t.Fatal("--dry-run migrated")
	}
	c.ok("migrate")
	c.json(&st, "migrate", "status")
	if st.Database != outbox.SchemaVersion || st.State != "up to date" {
		t.Fatalf("status after: %+v", st)
	}
	if out := c.ok("migrate"); !strings.Contains(out, "up to date") {
		t.Fatalf("second migrate: %s", out)
	}
}

// The operations an incident needs, end to end against a real database:
// topics, status with lag, pause and resume, reset, groups, dead letters
// (list, show, replay, discard, purge), vacuum.
func TestOperatorCommands(t *testing.T) {
	b := outboxtest.Setup(t)
	c := newCLI(t, b.Schema)
	c.ok("topics", "register", "orders", "2")
	var topics []struct {
		Topic      string
		Partitions int
	}
	c.ok("topics", "register", "payments", "2", "--forward-only")
	var paths []struct{ Topic, Path string }
	c.json(&paths, "topics", "list")
	if len(paths) != 2 || paths[0].Path != "log" || paths[1].Topic != "payments" || paths[1].Path != "forwarder-only" {
		t.Fatalf("topics list: %+v, want orders on the log path and payments forwarder-only", paths)
	}
	if out := c.ok("topics", "list"); !strings.Contains(out, "forwarder-only") {
		t.Fatalf("topics list: %s", out)
	}
	b.Exec(`DELETE FROM ` + b.Schema + `.partitions WHERE topic = 'payments'`)
	b.Exec(`DELETE FROM ` + b.Schema + `.topics WHERE name = 'payments'`)
	c.json(&topics, "topics", "list")
	if len(topics) != 1 || topics[0].Topic != "orders" || topics[0].Partitions != 2 {
		t.Fatalf("topics list: %+v", topics)
	}
	for i := range 6 {
		b.Publish("orders", outboxtest.Keyed("m"+strconv.Itoa(i), "k"+strconv.Itoa(i%2), i, "x"))
	}
	b.SequenceAll()

	// A group that consumed nothing yet: lag 6 in status and groups list.
	sub := b.Subscriber("billing", func(cfg *outbox.SubscriberConfig) { cfg.DisableSequencer = true })
	if _, err := sub.Subscribe(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	var groups []struct {
		Topic, Group string
		Lag          int64
	}
	outboxtest.WaitFor(t, "the group in groups list", 30*time.Second, func() bool {
		c.json(&groups, "groups", "list")
		return len(groups) == 1 && groups[0].Lag == 6
	})
	status := c.ok("status", "--group", "billing")
	for _, want := range []string{"topic orders", "group billing", "PART", "LAG"} {
		if !strings.Contains(status, want) {
			t.Fatalf("status lacks %q:\n%s", want, status)
		}
	}
	_ = sub.Close()

	// Pause and resume.
	c.ok("pause", "--group", "billing", "--topic", "orders", "--partition", "1")
	if n := b.Int("SELECT count(*) FROM " + b.Schema + ".cursors WHERE group_name = 'billing' AND paused"); n != 1 {
		t.Fatalf("%d partitions paused, want 1", n)
	}
	c.ok("resume", "--group", "billing", "--topic", "orders")
	if n := b.Int("SELECT count(*) FROM " + b.Schema + ".cursors WHERE group_name = 'billing' AND paused"); n != 0 {
		t.Fatalf("%d partitions still paused", n)
	}

	// Reset: refused without confirmation, done with --yes.
	part := itoa(b.Int("SELECT partition FROM " + b.Schema + ".partitions WHERE topic = 'orders' AND last_seq >= 2 ORDER BY partition LIMIT 1"))
	code, _, errOut := c.run("no\n", "reset", "--group", "billing", "--topic", "orders", "--partition", part, "--to-seq", "2")
	if code != exitError || !strings.Contains(errOut, "not confirmed") || strings.Contains(errOut, "--help") {
		t.Fatalf("unconfirmed reset: exit %d, %s; want exit 1, no usage text", code, errOut)
	}
	if n := b.Int("SELECT max(seq) FROM " + b.Schema + ".cursors WHERE group_name = 'billing'"); n != 0 {
		t.Fatalf("an unconfirmed reset moved a cursor to %d", n)
	}
	c.ok("reset", "--group", "billing", "--topic", "orders", "--partition", part, "--to-seq", "2", "--yes")
	if n := b.Int("SELECT seq FROM "+b.Schema+".cursors WHERE group_name = 'billing' AND partition = $1", part); n != 2 {
		t.Fatalf("cursor at %d after reset --to-seq 2", n)
	}

	// Dead letters.
	store, err := (&app{schema: b.Schema, pool: b.Pool}).deadLetters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, uuid := range []string{"poison-1", "poison-2"} {
		if _, err := store.Add(context.Background(), outboxtype.RejectedMessage{Group: "billing", Topic: "orders", UUID: uuid,
			Payload: []byte(`<script>alert(1)</script>`), Metadata: map[string]string{"k": "v"}, Reason: errString("bad")}); err != nil {
			t.Fatal(err)
		}
	}
	var page struct {
		Entries []struct {
			ID     int64
			UUID   string
			Status string
		}
	}
	c.json(&page, "dlq", "list", "--group", "billing", "--status", "pending")
	if len(page.Entries) != 2 {
		t.Fatalf("dlq list: %+v", page)
	}
	first, second := page.Entries[0].ID, page.Entries[1].ID
	if show := c.ok("dlq", "show", itoa(first)); !strings.Contains(show, "poison-1") || !strings.Contains(show, "metadata") {
		t.Fatalf("dlq show:\n%s", show)
	}
	c.ok("dlq", "replay", itoa(first), "--yes")
	if n := b.Int("SELECT count(*) FROM " + b.Schema + ".pending WHERE topic = 'orders'"); n != 1 {
		t.Fatalf("replay published %d messages, want 1", n)
	}
	c.ok("dlq", "discard", itoa(second), "--yes")
	c.json(&page, "dlq", "list", "--group", "billing")
	for _, e := range page.Entries {
		if e.Status == "pending" {
			t.Fatalf("entry %d still pending after replay/discard", e.ID)
		}
	}
	c.ok("dlq", "purge", "--yes")
	c.json(&page, "dlq", "list")
	if len(page.Entries) != 0 {
		t.Fatalf("purge left %d entries", len(page.Entries))
	}

	// Vacuum, and deleting the group.
	c.ok("vacuum")
	c.ok("groups", "delete", "billing", "--yes", "--force")
	c.json(&groups, "groups", "list")
	if len(groups) != 0 {
		t.Fatalf("group still listed after delete: %+v", groups)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

type errString string

func (e errString) Error() string { return string(e) }

// Exit codes: 2 for usage errors, 1 for failures, and messages that say
// what to do.
func TestExitCodesAndErrors(t *testing.T) {
	b := outboxtest.Setup(t)
	c := newCLI(t, b.Schema)
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"no-such-command"}, exitUsage, "unknown command"},
		{[]string{"status", "--no-such-flag"}, exitUsage, "unknown flag"},
		{[]string{"status", "-o", "yaml"}, exitUsage, "table or json"},
		{[]string{"pause", "--topic", "orders"}, exitUsage, "group"},
		{[]string{"dlq", "show", "abc"}, exitUsage, "positive number"},
		{[]string{"reset", "--group", "g", "--topic", "t"}, exitUsage, "exactly one of --to-seq and --to-time"},
		{[]string{"pause", "--group", "nobody", "--topic", "orders"}, exitError, "no such topic"},
	} {
		code, _, errOut := c.run("", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.says) {
			t.Errorf("outbox %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(tc.args, " "), code, errOut, tc.code, tc.says)
		}
	}
	noDB := cli{t: t, schema: b.Schema}
	if code, _, errOut := noDB.run("", "status"); code != exitUsage || !strings.Contains(errOut, "DATABASE_URL") {
		t.Errorf("no database: exit %d, %q", code, errOut)
	}
}

// Every command documents itself with --help, and every command that does
// something shows an example.
func TestEveryCommandHasHelpAndExamples(t *testing.T) {
	root := (&app{}).rootCommand()
	var walk func(cmd *cobra.Command)
	walk = func(cmd *cobra.Command) {
		if cmd.Short == "" {
			t.Errorf("%s: no short description", cmd.CommandPath())
		}
		if cmd.Runnable() && cmd.Example == "" && cmd.Parent() != nil && cmd.Parent().Example == "" {
			t.Errorf("%s: no example (on it or its parent)", cmd.CommandPath())
		}
		for _, sub := range cmd.Commands() {
			if sub.Name() != "help" && sub.Name() != "completion" {
				walk(sub)
			}
		}
	}
	walk(root)
	var out bytes.Buffer
	if code := execute(context.Background(), []string{"dlq", "--help"}, strings.NewReader(""), &out, &out, func(string) string { return "" }); code != exitOK || !strings.Contains(out.String(), "Examples:") {
		t.Fatalf("dlq --help: exit %d\n%s", code, out.String())
	}
}

// relay sequences what is committed until interrupted, with retention on
// by default, and refuses a forwarder without a broker or topics.
func TestRelaySequencesUntilInterrupted(t *testing.T) {
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	b.Publish("orders", outboxtest.Keyed("m1", "k", 1, "x"))
	c := newCLI(t, b.Schema)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errOut bytes.Buffer
	go func() {
		env := func(k string) string {
			if k == "DATABASE_URL" {
				return c.url
			}
			return ""
		}
		done <- execute(ctx, []string{"pipeline", "--schema", b.Schema}, strings.NewReader(""), &bytes.Buffer{}, &errOut, env)
	}()
	outboxtest.WaitFor(t, "the relay to sequence the message", 30*time.Second, func() bool { return b.Rows("log") == 1 })
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("relay exited %d after an interrupt: %s", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop when interrupted")
	}
	// The pipeline: a sequencer and, by default, retention.
	if !strings.Contains(errOut.String(), "(sequencer, retention)") {
		t.Fatalf("relay's start line does not say it runs retention: %s", errOut.String())
	}
	if code, _, e := c.run("", "pipeline", "--keep-for", "-1s"); code != exitUsage || !strings.Contains(e, "--keep-for -1s: must not be negative") {
		t.Fatalf("relay --keep-for -1s: exit %d, %s", code, e)
	}
	if code, _, e := c.run("", "pipeline", "--kafka", "localhost:9092"); code != exitUsage || !strings.Contains(e, "--topic") {
		t.Fatalf("relay --kafka without --topic: exit %d, %s", code, e)
	}
	if code, _, e := c.run("", "pipeline", "--topic", "orders"); code != exitUsage || !strings.Contains(e, "--kafka and --nats") {
		t.Fatalf("relay --topic without a broker: exit %d, %s", code, e)
	}
	if code, _, e := c.run("", "pipeline", "--topic", "orders", "--nats", "nats://localhost:4222", "--at-least-once"); code != exitUsage || !strings.Contains(e, "--kafka only") {
		t.Fatalf("relay --at-least-once to NATS: exit %d, %s", code, e)
	}
	if code, _, e := c.run("", "pipeline", "--takeover-timeout", "10s"); code != exitUsage || !strings.Contains(e, "--wal only") {
		t.Fatalf("relay --takeover-timeout without --wal: exit %d, %s", code, e)
	}
	// The value reaches relay.Config, whose Validate refuses it.
	if code, _, e := c.run("", "pipeline", "--wal", "--takeover-timeout", "10ms"); code != exitUsage || !strings.Contains(e, "--takeover-timeout 10ms must be at least 100ms") {
		t.Fatalf("relay --wal --takeover-timeout 10ms: exit %d, %s", code, e)
	}
}

// serve refuses actions without a token, and serves the console (read-only)
// on the address given until interrupted.
func TestServe(t *testing.T) {
	b := outboxtest.Setup(t)
	c := newCLI(t, b.Schema)
	if code, _, e := c.run("", "serve", "--enable-actions"); code != exitUsage || !strings.Contains(e, "token") {
		t.Fatalf("serve --enable-actions without a token: exit %d, %s", code, e)
	}
	if code, _, e := c.run("", "serve", "--history-window", "5s", "--history-interval", "5s"); code != exitUsage || !strings.Contains(e, "--history-window") || !strings.Contains(e, "fewer than two samples") {
		t.Fatalf("serve with a history window of one sample: exit %d, %s", code, e)
	}
	b.Register("orders", 1)
	sub := b.Subscriber("charts", nil)
	if _, err := sub.Subscribe(outboxtest.Ctx(t), "orders"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errOut syncBuffer
	go func() {
		env := func(k string) string {
			if k == "DATABASE_URL" {
				return c.url
			}
			return ""
		}
		done <- execute(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--schema", b.Schema, "--history-window", "1h", "--history-interval", "30s"},
			strings.NewReader(""), &bytes.Buffer{}, &errOut, env)
	}()
	var addr string
	outboxtest.WaitFor(t, "the console to listen", 30*time.Second, func() bool {
		m := regexp.MustCompile(`console on (http://[^ ]+/) \(read-only\)`).FindStringSubmatch(errOut.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	resp, err := http.Get(addr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "outbox console") {
		t.Fatalf("GET /: %d\n%s", resp.StatusCode, body)
	}
	// The history flags reach the console: its charts span an hour, a sample every 30 s.
	resp, err = http.Get(addr + "api/history?topic=orders&group=charts")
	if err != nil {
		t.Fatal(err)
	}
	var history struct {
		Window   float64 `json:"window_seconds"`
		Interval float64 `json:"interval_seconds"`
	}
	err = json.NewDecoder(resp.Body).Decode(&history)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || history.Window != 3600 || history.Interval != 30 {
		t.Fatalf("GET /api/history: %d, %v, %+v; want a window of 3600 s and an interval of 30 s", resp.StatusCode, err, history)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("serve exited %d after an interrupt: %s", code, errOut.String())
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
