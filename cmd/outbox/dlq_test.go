package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// dlq purge never deletes a pending dead letter unless --status names
// pending, and its question counts what it deletes by status and what it
// keeps.
func TestDLQPurgeKeepsPendingUnlessNamed(t *testing.T) {
	b := outboxtest.Setup(t)
	c := newCLI(t, b.Schema)
	ctx := context.Background()
	b.Register("orders", 1)
	store, err := deadletter.NewStore(deadletter.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := range 6 {
		e, err := store.Add(ctx, outboxtype.RejectedMessage{Group: "billing", Topic: "orders", Seq: int64(i + 1), UUID: "m" + itoa(int64(i)), Reason: errString("bad")})
		if err != nil || !e {
			t.Fatal(err)
		}
	}
	page, err := store.List(ctx, deadletter.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Entries {
		ids = append(ids, e.ID)
	}
	c.ok("dlq", "replay", itoa(ids[0]), "--yes")
	c.ok("dlq", "discard", itoa(ids[1]), "--yes")
	c.ok("dlq", "discard", itoa(ids[2]), "--yes")
	pending := func() int64 {
		return b.Int("SELECT count(*) FROM " + b.Schema + ".dead_letters WHERE status = 'pending'")
	}

	// The question names the counts; refused, nothing is deleted.
	code, _, stderr := c.run("no\n", "dlq", "purge")
	if code != exitError || !strings.Contains(stderr, "Delete 3 dead letters of any age: 1 replayed, 2 discarded.") ||
		!strings.Contains(stderr, "3 pending dead letters of that age are kept") {
		t.Fatalf("dlq purge question: exit %d\n%s", code, stderr)
	}
	if n := b.Rows("dead_letters"); n != 6 {
		t.Fatalf("an unconfirmed purge left %d of 6 entries", n)
	}
	// --yes with no filter: the resolved ones go, the pending ones stay.
	if out := c.ok("dlq", "purge", "--yes"); !strings.Contains(out, "deleted 3 dead letters (replayed or discarded). 3 pending dead letters of that age are kept") {
		t.Fatalf("dlq purge --yes:\n%s", out)
	}
	if n, p := b.Rows("dead_letters"), pending(); n != 3 || p != 3 {
		t.Fatalf("dlq purge --yes left %d entries, %d pending; want the 3 pending ones", n, p)
	}
	if out := c.ok("dlq", "purge", "--yes", "--status", "replayed,discarded"); !strings.Contains(out, "no dead letters to delete") {
		t.Fatalf("dlq purge with nothing to delete:\n%s", out)
	}
	// Named, pending ones go, after a question that says what that means.
	code, _, stderr = c.run("no\n", "dlq", "purge", "--status", "pending")
	if code != exitError || !strings.Contains(stderr, "Delete 3 dead letters of any age: 3 pending. The 3 pending ones were never replayed or discarded") {
		t.Fatalf("dlq purge --status pending question: exit %d\n%s", code, stderr)
	}
	c.ok("dlq", "purge", "--status", "pending", "--yes")
	if n := b.Rows("dead_letters"); n != 0 {
		t.Fatalf("dlq purge --status pending left %d entries", n)
	}

	// --group and --topic purge one group's (and topic's) entries only.
	for i, g := range []string{"billing", "billing", "shipping", "shipping", "shipping"} {
		topic := "orders"
		if i == 4 {
			topic = "returns"
		}
		if _, err := store.Add(ctx, outboxtype.RejectedMessage{Group: g, Topic: topic, UUID: "g" + itoa(int64(i)), Reason: errString("bad")}); err != nil {
			t.Fatal(err)
		}
	}
	code, _, stderr = c.run("no\n", "dlq", "purge", "--group", "shipping", "--topic", "orders", "--status", "pending")
	if code != exitError || !strings.Contains(stderr, `Delete 2 dead letters of any age of group "shipping" on topic orders: 2 pending.`) {
		t.Fatalf("dlq purge --group shipping --topic orders question: exit %d\n%s", code, stderr)
	}
	c.ok("dlq", "purge", "--group", "shipping", "--topic", "orders", "--status", "pending", "--yes")
	if n, left := b.Rows("dead_letters"), b.Int("SELECT count(*) FROM "+b.Schema+".dead_letters WHERE group_name = 'shipping'"); n != 3 || left != 1 {
		t.Fatalf("dlq purge --group shipping --topic orders left %d entries, %d of shipping; want billing's 2 and shipping's returns", n, left)
	}
	// A group name that cannot be stored is refused by Add, typed.
	if _, err := store.Add(ctx, outboxtype.RejectedMessage{Group: "bill\u202eing", Topic: "orders", UUID: "bidi", Reason: errString("bad")}); !errors.Is(err, outbox.ErrInvalidName) {
		t.Fatalf("Add with a bidi override in the group: %v, want ErrInvalidName", err)
	}
}

// A group or topic that does not exist is an error (exit 1, "no such
// group" / "no such topic"), never an empty table or "0 partitions".
func TestUnknownGroupOrTopicIsAnError(t *testing.T) {
	b := outboxtest.Setup(t)
	c := newCLI(t, b.Schema)
	b.Register("orders", 2)
	b.Exec(`INSERT INTO ` + b.Schema + `.cursors (group_name, topic, partition, seq) VALUES ('billing', 'orders', 0, 0), ('billing', 'orders', 1, 0)`)
	b.Register("invoices", 1)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"status", "--group", "nope"}, `no such group "nope"`},
		{[]string{"status", "--topic", "nope"}, `no such topic "nope"`},
		{[]string{"status", "--group", "billing", "--topic", "invoices"}, `no such group "billing" on topic "invoices"`},
		{[]string{"status", "--group", "nope", "--watch", "1s"}, `no such group "nope"`},
		{[]string{"groups", "list", "--topic", "nope"}, `no such topic "nope"`},
		{[]string{"held", "list", "--group", "nope"}, `no such group "nope"`},
		{[]string{"held", "retry", "--group", "nope", "--topic", "orders", "--key", "k"}, `no such group "nope"`},
		{[]string{"held", "dead-letter", "--group", "billing", "--topic", "nope", "--key", "k", "--yes"}, `no such topic "nope"`},
		{[]string{"pause", "--group", "nope"}, `no such group "nope"`},
		{[]string{"pause", "--group", "billing", "--topic", "nope"}, `no such topic "nope"`},
		{[]string{"pause", "--group", "billing", "--topic", "orders", "--partition", "0,7"}, `no cursor in partition(s) [7] of topic "orders"`},
		{[]string{"resume", "--group", "nope", "--topic", "orders"}, `no such group "nope"`},
		{[]string{"reset", "--group", "nope", "--topic", "orders", "--to-seq", "0", "--yes"}, `no such group "nope"`},
		{[]string{"groups", "delete", "nope", "--yes"}, `no such group "nope"`},
		{[]string{"dlq", "list", "--group", "nope"}, `no such group "nope"`},
		{[]string{"dlq", "list", "--topic", "nope"}, `no such topic "nope"`},
	} {
		code, stdout, stderr := c.run("", tc.args...)
		if code != exitError || !strings.Contains(stderr, tc.says) || stdout != "" {
			t.Errorf("outbox %s: exit %d, stdout %q, stderr %q; want exit 1 saying %s", strings.Join(tc.args, " "), code, stdout, stderr, tc.says)
		}
	}
	if n := b.Int("SELECT count(*) FROM " + b.Schema + ".cursors WHERE paused"); n != 0 {
		t.Fatalf("a refused pause paused %d partitions", n)
	}
	// What exists and is empty is no error.
	for _, args := range [][]string{{"status", "--topic", "invoices"}, {"dlq", "list", "--group", "billing"}, {"held", "list", "--group", "billing"}, {"groups", "list", "--topic", "invoices"}} {
		c.ok(args...)
	}
}
