package admin_test

import (
	"slices"
	"testing"

	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// A pause, a resume and a reset are announced to the group's lease
// managers on the members channel when they commit, so that members which
// balance seldom (a settled group) give back or take the partitions at
// once; a refused one announces nothing.
func TestPauseResumeAndResetAreAnnouncedToTheGroup(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	e.Register("orders", 2)
	e.PublishN("orders", 4, "m")
	e.SequenceAll()
	e.Exec(`INSERT INTO ` + e.Schema + `.cursors (group_name, topic, partition, seq) VALUES ('g', 'orders', 0, 0), ('g', 'orders', 1, 0)`)

	heard := e.Listen(names.MembersChannel(e.Schema))
	expect := func(what string, want ...string) {
		t.Helper()
		if got := heard(); !slices.Equal(got, want) {
			t.Errorf("%s: announced %q, want %q", what, got, want)
		}
	}

	if _, err := e.admin.Pause(ctx, admin.Scope{Group: "g", Topic: "orders", Partitions: []int{1}}); err != nil {
		t.Fatal(err)
	}
	expect("pause", names.MembersPayload("g", "orders"))
	if _, err := e.admin.Resume(ctx, admin.Scope{Group: "g"}); err != nil {
		t.Fatal(err)
	}
	expect("resume of every topic of the group", names.MembersPayload("g", ""))
	if _, err := e.admin.ResetCursor(ctx, admin.Scope{Group: "g", Topic: "orders"}, admin.ToSeq(0)); err != nil {
		t.Fatal(err)
	}
	expect("reset", names.MembersPayload("g", "orders"))

	// Refused (a partition the group has no cursor in): rolled back,
	// nothing announced.
	if _, err := e.admin.Pause(ctx, admin.Scope{Group: "g", Topic: "orders", Partitions: []int{7}}); err == nil {
		t.Fatal("a pause of a partition without a cursor was not refused")
	}
	expect("refused pause")
}
