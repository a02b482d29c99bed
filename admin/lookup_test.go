package admin_test

import (
	"errors"
	"strings"
	"testing"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// A typo in a group or topic name is an error that says which name is
// unknown, from every admin call, never an empty report or "0 paused".
func TestUnknownGroupOrTopicIsNotFound(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	e.Register("orders", 2)
	e.Register("invoices", 1)
	e.Exec(`INSERT INTO ` + e.Schema + `.cursors (group_name, topic, partition, seq) VALUES ('billing', 'orders', 0, 0), ('billing', 'orders', 1, 0)`)
	e.Exec(`INSERT INTO ` + e.Schema + `.members (group_name, topic, member_id, heartbeat_at) VALUES ('watcher', 'invoices', 'm-1', now())`)

	want := func(t *testing.T, call string, err error, what, group, topic string) {
		t.Helper()
		var nf *admin.NotFoundError
		if !errors.As(err, &nf) || !errors.Is(err, outbox.ErrNotFound) || !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("%s: %v, want a *NotFoundError", call, err)
		}
		if nf.What != what || nf.Group != group || nf.Topic != topic {
			t.Fatalf("%s: %+v, want %s %q %q", call, nf, what, group, topic)
		}
		if what == "topic" && !errors.Is(err, outbox.ErrUnknownTopic) {
			t.Fatalf("%s: an unregistered topic does not match outbox.ErrUnknownTopic: %v", call, err)
		}
		says := map[string]string{"topic": "no such topic", "group": "no such group", "partition": "no cursor in partition", "held key": "holds no key"}[what]
		if !strings.Contains(err.Error(), says) {
			t.Fatalf("%s: %q does not say %q", call, err, says)
		}
	}

	// Status.
	_, err := e.admin.Status(ctx, admin.Filter{Group: "nope"})
	want(t, "Status(group nope)", err, "group", "nope", "")
	_, err = e.admin.Status(ctx, admin.Filter{Topic: "nope"})
	want(t, "Status(topic nope)", err, "topic", "", "nope")
	_, err = e.admin.Status(ctx, admin.Filter{Group: "billing", Topic: "nope"})
	want(t, "Status(billing, topic nope)", err, "topic", "billing", "nope")
	_, err = e.admin.Status(ctx, admin.Filter{Group: "billing", Topic: "invoices"})
	want(t, "Status(billing on invoices)", err, "group", "billing", "invoices")
	_, err = e.admin.Status(ctx, admin.Filter{Group: "nope", Topic: "invoices"})
	want(t, "Status(nope on invoices)", err, "group", "nope", "")
	// What exists is reported, a topic without groups and a group with
	// members only included.
	for _, f := range []admin.Filter{{}, {Group: "billing"}, {Topic: "invoices"}, {Group: "billing", Topic: "orders"}, {Group: "watcher"}} {
		rep, err := e.admin.Status(ctx, f)
		if err != nil || len(rep.Topics) == 0 {
			t.Fatalf("Status(%+v): %d topics, %v", f, len(rep.Topics), err)
		}
		if err := e.admin.Exists(ctx, f); err != nil {
			t.Fatalf("Exists(%+v): %v", f, err)
		}
	}
	want(t, "Exists(group nope)", e.admin.Exists(ctx, admin.Filter{Group: "nope"}), "group", "nope", "")
	want(t, "Exists(topic nope)", e.admin.Exists(ctx, admin.Filter{Topic: "nope"}), "topic", "", "nope")

	// Pause, Resume, ResetCursor.
	_, err = e.admin.Pause(ctx, admin.Scope{Group: "nope"})
	want(t, "Pause(nope)", err, "group", "nope", "")
	_, err = e.admin.Resume(ctx, admin.Scope{Group: "billing", Topic: "nope"})
	want(t, "Resume(billing, topic nope)", err, "topic", "billing", "nope")
	_, err = e.admin.Pause(ctx, admin.Scope{Group: "billing", Topic: "invoices"})
	want(t, "Pause(billing on invoices)", err, "group", "billing", "invoices")
	_, err = e.admin.Pause(ctx, admin.Scope{Group: "billing", Topic: "orders", Partitions: []int{1, 5, 7}})
	want(t, "Pause(billing, partitions 1 5 7)", err, "partition", "billing", "orders")
	var nf *admin.NotFoundError
	if errors.As(err, &nf); len(nf.Partitions) != 2 || nf.Partitions[0] != 5 || nf.Partitions[1] != 7 {
		t.Fatalf("missing partitions %v, want [5 7]", nf.Partitions)
	}
	if n := e.Int(`SELECT count(*) FROM ` + e.Schema + `.cursors WHERE paused`); n != 0 {
		t.Fatalf("a refused pause paused %d partitions", n)
	}
	_, err = e.admin.ResetCursor(ctx, admin.Scope{Group: "nope", Topic: "orders"}, admin.ToSeq(0))
	want(t, "ResetCursor(nope)", err, "group", "nope", "")

	// DeleteGroup and the held-key actions.
	_, err = e.admin.DeleteGroup(ctx, "nope", admin.DeleteGroupOptions{})
	want(t, "DeleteGroup(nope)", err, "group", "nope", "")
	_, err = e.admin.DeleteGroup(ctx, "billing", admin.DeleteGroupOptions{Topic: "nope"})
	want(t, "DeleteGroup(billing, topic nope)", err, "topic", "billing", "nope")
	_, err = e.admin.RetryHeldNow(ctx, admin.HeldRef{Group: "nope", Topic: "orders", Key: "k"})
	want(t, "RetryHeldNow(nope)", err, "group", "nope", "")
	_, err = e.admin.DeadLetterHeld(ctx, admin.HeldRef{Group: "billing", Topic: "nope", Key: "k"})
	want(t, "DeadLetterHeld(topic nope)", err, "topic", "billing", "nope")
	_, err = e.admin.RetryHeldNow(ctx, admin.HeldRef{Group: "billing", Topic: "orders", Partition: 1, Key: "k"})
	want(t, "RetryHeldNow(a key not held)", err, "held key", "billing", "orders")
}
