package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// outbox held lists a held key, retries it, and dead-letters it after
// confirmation; status shows it.
func TestHeldCommands(t *testing.T) {
	b := outboxtest.Setup(t)
	c := newCLI(t, b.Schema)
	b.Register("orders", 1)
	b.Publish("orders", outboxtest.Keyed("a1", "customer-42", 1, "x"), outboxtest.Keyed("b1", "other", 1, "x"),
		outboxtest.Keyed("a2", "customer-42", 2, "x"))
	store, err := deadletter.NewStore(deadletter.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.HoldingConsumer("billing", "orders", store, "customer-42")
	var held []struct {
		Group, Topic, Key string
		Partition         int
		HeadSeq           int64 `json:"head_seq"`
		Messages          int
		Attempts          int
	}
	outboxtest.WaitFor(t, "customer-42 held", 30*time.Second, func() bool {
		// "no such group" until the consumer joined.
		code, out, _ := c.run("", "held", "list", "--group", "billing", "-o", "json")
		return code == exitOK && json.Unmarshal([]byte(out), &held) == nil && len(held) == 1 && held[0].Messages == 2
	})
	if h := held[0]; h.Key != "customer-42" || h.HeadSeq != 1 || h.Attempts != 1 || h.Topic != "orders" {
		t.Fatalf("held list: %+v", h)
	}
	if table := c.ok("held", "list"); !strings.Contains(table, "customer-42") || !strings.Contains(table, "RETRY_IN") {
		t.Fatalf("held list table:\n%s", table)
	}
	if status := c.ok("status"); !strings.Contains(status, "1-keys-held") || !strings.Contains(status, "1 keys held") {
		t.Fatalf("status does not show the held key:\n%s", status)
	}
	if code, _, errOut := c.run("", "held", "retry", "--group", "billing", "--topic", "orders"); code != exitUsage || !strings.Contains(errOut, "--key or --seq") {
		t.Fatalf("retry without a key: exit %d, %s", code, errOut)
	}
	if code, _, errOut := c.run("", "held", "retry", "--group", "billing", "--topic", "orders", "--key", "nobody"); code == exitOK || !strings.Contains(errOut, `holds no key "nobody"`) {
		t.Fatalf("retry of a key not held: exit %d, %s", code, errOut)
	}
	c.ok("held", "retry", "--group", "billing", "--topic", "orders", "--key", "customer-42")
	outboxtest.WaitFor(t, "the retry", 30*time.Second, func() bool {
		return b.Int("SELECT attempts FROM "+b.Schema+".held WHERE seq = 1") == 1 &&
			b.Int("SELECT count(*) FROM "+b.Schema+".held WHERE seq = 1 AND retry_at > now() + interval '30 minutes'") == 1
	})
	code, _, errOut := c.run("no\n", "held", "dead-letter", "--group", "billing", "--topic", "orders", "--key", "customer-42")
	if code != exitError || !strings.Contains(errOut, "not confirmed") || strings.Contains(errOut, "--help") {
		t.Fatalf("unconfirmed dead-letter: exit %d, %s; want exit 1, no usage text", code, errOut)
	}
	c.ok("held", "dead-letter", "--group", "billing", "--topic", "orders", "--key", "customer-42", "--yes")
	outboxtest.WaitFor(t, "the key dead-lettered", 30*time.Second, func() bool {
		return b.Rows("held") == 0 && b.Rows("dead_letters") == 2
	})
}
