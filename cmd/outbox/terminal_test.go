package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// What a message can carry to the operator's terminal: an OSC that
// retitles the window, a bell, a CSI that clears the screen, a right-to-left
// override, and (in the group name) a CR/LF that would start a forged table
// row.
const (
	evilError = "boom \x1b]0;pwned\a\x1b[2J \u202Edesrever"
	evilKey   = "key\x1b]0;pwned\a\u202E24-remotsuc"
	evilGroup = "evil\r\nfake-row\x1b[2J"
)

// terminalSafe fails the test when out holds a character a terminal acts
// on: ESC, BEL, CR, C1 controls, a bidirectional override; a line feed
// only lays lines out, so a line may not start with what followed the
// group's CR/LF.
func terminalSafe(t *testing.T, what, out string) {
	t.Helper()
	for i, r := range out {
		if r == '\x1b' || r == '\a' || r == '\r' || r >= 0x80 && r <= 0x9f || r == '\u202E' {
			t.Fatalf("%s: raw %U at byte %d:\n%q", what, r, i, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "fake-row") {
			t.Fatalf("%s: the group's line feed started a row of its own:\n%s", what, out)
		}
	}
}

// name is the command of args: "status", "dlq show".
func name(args []string) string {
	if args[0] == "held" || args[0] == "dlq" || args[0] == "groups" {
		return args[0] + " " + args[1]
	}
	return args[0]
}

// Handler errors, partition keys, group names and dead letters that hold
// escape sequences, CR/LF and bidirectional overrides reach the terminal
// escaped in every human-readable output (tables, text, prompts, errors),
// and exact in JSON.
func TestMessageDataReachesTheTerminalEscaped(t *testing.T) {
	b := outboxtest.Setup(t)
	c := newCLI(t, b.Schema)
	ctx := outboxtest.Ctx(t)
	b.Register("orders", 1)
	b.Publish("orders", outboxtest.Keyed("poison", evilKey, 1, "x"), outboxtest.Keyed("fine", "other", 1, "x"))
	store, err := deadletter.NewStore(deadletter.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A real consumer holds the key back (key isolation); its failure
	// text is the handler error.
	b.HoldingConsumer("billing", "orders", store, evilKey)
	outboxtest.WaitFor(t, "the key held", 30*time.Second, func() bool { return b.Rows("held") == 1 })
	b.Exec(`UPDATE `+b.Schema+`.held SET last_error = $1`, evilError)
	b.Exec(`UPDATE `+b.Schema+`.cursors SET attempts = 3, last_error = $1`, evilError)
	// A group of an older release, whose name was not checked, holding
	// retention back.
	b.Exec(`INSERT INTO `+b.Schema+`.cursors (group_name, topic, partition, seq, attempts, last_error) VALUES ($1, 'orders', 0, 0, 2, $2)`, evilGroup, evilError)
	// Its dead letter too (Store.Add refuses such a group name now: the
	// row is renamed as an older release would have written it).
	if _, err := store.Add(ctx, outboxtype.RejectedMessage{Group: "renamed-below", Topic: "orders", UUID: "u\x1b[2J", PartitionKey: evilKey,
		Metadata: map[string]string{"h\x1b]0;x\a": "v\u202E"}, Payload: []byte(evilError), Reason: errString(evilError)}); err != nil {
		t.Fatal(err)
	}
	b.Exec(`UPDATE `+b.Schema+`.dead_letters SET group_name = $1 WHERE group_name = 'renamed-below'`, evilGroup)
	var page deadletter.Page
	c.json(&page, "dlq", "list")
	if len(page.Entries) != 1 {
		t.Fatalf("dlq list: %+v", page)
	}
	id := itoa(page.Entries[0].ID)

	for _, args := range [][]string{
		{"status"}, {"status", "--group", evilGroup}, {"held", "list"}, {"groups", "list"}, {"dlq", "list"},
		{"dlq", "show", id}, {"pause", "--group", evilGroup}, {"resume", "--group", evilGroup}, {"vacuum"},
	} {
		out := c.ok(args...)
		terminalSafe(t, strings.Join(args, " "), out)
		for _, want := range map[string][]string{
			"status":    {`evil\r\nfake-row\x1b[2J`, `boom \x1b]0;pwned\x07\x1b[2J \u202edesrever`},
			"held list": {`key\x1b]0;pwned\x07\u202e24-remotsuc`, `boom \x1b]0;pwned\x07`},
			"dlq list":  {`evil\r\nfake-row\x1b[2J`, `u\x1b[2J`, `boom \x1b]0;pwned\x07`},
			"dlq show":  {`evil\r\nfake-row\x1b[2J`, `key\x1b]0;pwned\x07\u202e24-remotsuc`, `h\x1b]0;x\x07 = v\u202e`, `boom \x1b]0;pwned\x07\x1b[2J \u202edesrever`},
			"vacuum":    {`held back by group evil\r\nfake-row\x1b[2J on orders`},
			"pause":     {`paused 1 partitions of group evil\r\nfake-row\x1b[2J`},
		}[name(args)] {
			if !strings.Contains(out, want) {
				t.Fatalf("outbox %s does not show %s:\n%s", strings.Join(args, " "), want, out)
			}
		}
	}

	// status --watch: the screen is cleared by the command itself, and by
	// nothing else.
	watchCtx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	var out, errOut bytes.Buffer
	env := func(k string) string {
		if k == "DATABASE_URL" {
			return c.url
		}
		return ""
	}
	if code := execute(watchCtx, []string{"status", "--watch", "300ms", "--schema", b.Schema}, strings.NewReader(""), &out, &errOut, env); code != exitOK {
		t.Fatalf("status --watch: exit %d: %s", code, errOut.String())
	}
	frames := strings.Count(out.String(), "\x1b[H\x1b[2J")
	if frames < 2 {
		t.Fatalf("status --watch refreshed %d times", frames)
	}
	terminalSafe(t, "status --watch", strings.ReplaceAll(out.String(), "\x1b[H\x1b[2J", ""))

	// A prompt and an error that name the group.
	code, stdout, stderr := c.run("no\n", "groups", "delete", evilGroup)
	if code != exitError || !strings.Contains(stderr, `Delete consumer group evil\r\nfake-row\x1b[2J on every topic?`) {
		t.Fatalf("groups delete prompt: exit %d\n%s", code, stderr)
	}
	terminalSafe(t, "groups delete prompt", stdout+stderr)
	code, stdout, stderr = c.run("", "status", "--group", "nope\x1b]0;pwned\a")
	if code != exitError || !strings.Contains(stderr, `no such group "nope\x1b]0;pwned\a"`) {
		t.Fatalf("status of an unknown group: exit %d\n%s", code, stderr)
	}
	terminalSafe(t, "an error", stdout+stderr)

	// JSON: the exact strings, as \u escapes a terminal shows as they are.
	raw := c.ok("status", "-o", "json")
	if strings.ContainsAny(raw, "\x1b\a\r\u202E") {
		t.Fatalf("status -o json holds a raw control or bidi character:\n%q", raw)
	}
	var rep struct {
		Topics []struct {
			Groups []struct {
				Group      string
				Partitions []struct {
					LastError string `json:"last_error"`
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(raw), &rep); err != nil {
		t.Fatal(err)
	}
	var groups []string
	for _, g := range rep.Topics[0].Groups {
		groups = append(groups, g.Group)
		if g.Group == evilGroup && g.Partitions[0].LastError != evilError {
			t.Fatalf("status -o json: last_error %q, want %q", g.Partitions[0].LastError, evilError)
		}
	}
	if len(groups) != 2 || groups[0] != "billing" || groups[1] != evilGroup {
		t.Fatalf("status -o json: groups %q", groups)
	}
	var held []struct {
		Key       string
		LastError string `json:"last_error"`
	}
	c.json(&held, "held", "list")
	if len(held) != 1 || held[0].Key != evilKey || held[0].LastError != evilError {
		t.Fatalf("held list -o json: %+v", held)
	}
	var e deadletter.Entry
	c.json(&e, "dlq", "show", id)
	if e.Group != evilGroup || e.PartitionKey != evilKey || e.Reason != evilError || string(e.Payload) != evilError || e.Metadata["h\x1b]0;x\a"] != "v\u202E" {
		t.Fatalf("dlq show -o json: %+v", e)
	}
}
