package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/retention"
)

// An abandoned group pins retention; DeleteGroup removes it, but not while
// it is in use.
func TestDeleteGroupIsRefusedWhileLiveAndFreesRetention(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 2)
	e.PublishN("orders", 20, "m")
	e.SequenceAll()

	// "busy" consumes everything; "gone" joined once and stopped at 0.
	busy := e.subscriber(t, "busy")
	rec := &recorder{}
	msgs, err := busy.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	done := rec.run(msgs)
	outboxtest.WaitFor(t, "busy to consume everything and move its cursors", 30*time.Second, func() bool {
		if rec.count() < 20 {
			return false
		}
		var lag int64
		if err := e.Pool.QueryRow(outboxtest.Ctx(t), `SELECT coalesce(sum(p.last_seq - c.seq), -1) FROM `+e.Schema+`.cursors c
			JOIN `+e.Schema+`.partitions p USING (topic, partition) WHERE c.group_name = 'busy'`).Scan(&lag); err != nil {
			t.Fatal(err)
		}
		return lag == 0
	})
	e.Exec(`INSERT INTO ` + e.Schema + `.cursors (group_name, topic, partition, updated_at)
		SELECT 'gone', topic, partition, now() - interval '3 days' FROM ` + e.Schema + `.partitions WHERE topic = 'orders'`)

	rep, err := e.admin.Status(outboxtest.Ctx(t), admin.Filter{Topic: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	topic := rep.Topics[0]
	if topic.RetentionHeldBy != "gone" {
		t.Fatalf("retention held by %q, want gone", topic.RetentionHeldBy)
	}
	for _, g := range topic.Groups {
		switch g.Group {
		case "gone":
			if len(g.Members) != 0 || !g.HoldsRetention || g.LastActivity == nil || time.Since(*g.LastActivity) < 48*time.Hour {
				t.Fatalf("gone: %+v", g)
			}
		case "busy":
			// Every Subscriber can take a message out (its RejectHandler is
			// the schema's dead-letter table unless set).
			if len(g.Members) != 1 || g.HoldsRetention || g.RetriesForever || !g.Members[0].CanReject {
				t.Fatalf("busy: members %+v, holds %v, retries forever %v", g.Members, g.HoldsRetention, g.RetriesForever)
			}
		}
	}

	// The vacuum keeps everything for "gone", and says so.
	v, err := retention.NewVacuum(retention.Config{Schema: e.Schema, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	pass, err := v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if pass.Deleted != 0 || len(pass.HeldBack) != 1 || pass.HeldBack[0].Group != "gone" || pass.HeldBack[0].Messages != 20 || pass.HeldBack[0].LiveMembers != 0 {
		t.Fatalf("pass %+v: want nothing deleted, held back by gone (20 messages, no live member)", pass)
	}

	// A live group is refused, with its members named.
	var active *admin.GroupActiveError
	if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "busy", admin.DeleteGroupOptions{}); !errors.Is(err, admin.ErrGroupActive) || !errors.As(err, &active) || len(active.Members) != 1 {
		t.Fatalf("DeleteGroup(busy) = %v, want ErrGroupActive naming its member", err)
	}
	if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "nobody", admin.DeleteGroupOptions{}); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("DeleteGroup(nobody) = %v, want ErrNotFound", err)
	}
	deleted, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "gone", admin.DeleteGroupOptions{})
	if err != nil || deleted.Cursors != 2 {
		t.Fatalf("DeleteGroup(gone) = %+v, %v; want its 2 cursors", deleted, err)
	}
	if pass, err = v.VacuumOnce(outboxtest.Ctx(t)); err != nil || pass.Deleted != 20 || len(pass.HeldBack) != 0 {
		t.Fatalf("after the delete: pass %+v, %v; want the 20 messages deleted", pass, err)
	}

	// Force deletes a live group.
	if deleted, err = e.admin.DeleteGroup(outboxtest.Ctx(t), "busy", admin.DeleteGroupOptions{Force: true}); err != nil || deleted.Cursors != 2 || deleted.Members != 1 {
		t.Fatalf("forced DeleteGroup(busy) = %+v, %v", deleted, err)
	}
	// Its subscriber still runs: the status keeps showing the group, by
	// its live member.
	outboxtest.WaitFor(t, "busy's running member to show again", 10*time.Second, func() bool {
		rep, err := e.admin.Status(outboxtest.Ctx(t), admin.Filter{Group: "busy"})
		if errors.Is(err, outbox.ErrNotFound) {
			return false // no row of it until its member heartbeats again
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Topics) == 1 && len(rep.Topics[0].Groups) == 1 && len(rep.Topics[0].Groups[0].Members) == 1 {
			t.Logf("after a forced delete of a running group: %d partitions", len(rep.Topics[0].Groups[0].Partitions))
			return true
		}
		return false
	})
	_ = busy.Close()
	done.Wait()
}

// Failure mode 7's status side: the backoff deadline and the delivery
// count of each partition, and deliveries that ended without an outcome
// (more deliveries than attempts while no lease is live).
func TestStatusShowsBackoffAndDeliveries(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 3)
	e.Exec(`INSERT INTO ` + e.Schema + `.cursors (group_name, topic, partition, attempts, deliveries, backoff_until, last_error, lease_owner, lease_expires_at,
			inflight_from, inflight_to, suspect_from, suspect_to)
		VALUES ('g', 'orders', 0, 2, 3, now() + interval '1 minute', 'boom', 'dead-1', now() - interval '1 second', 1, 1, 0, 0),
		('g', 'orders', 1, 0, 0, now() - interval '1 minute', NULL, NULL, NULL, 0, 0, 1, 4),
		('g', 'orders', 2, 1, 2, NULL, 'boom', 'live-1', now() + interval '1 minute', 1, 1, 0, 0)`)
	rep, err := e.admin.Status(outboxtest.Ctx(t), admin.Filter{Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	g := rep.Topics[0].Groups[0]
	p0, p1, p2 := g.Partitions[0], g.Partitions[1], g.Partitions[2]
	if g.BackingOff != 1 || !p0.BackingOff || p0.BackoffUntil == nil || !p0.BackoffUntil.After(rep.At) || p0.Deliveries != 3 || p0.Attempts != 2 ||
		p1.BackingOff || p1.BackoffUntil == nil || p2.BackingOff || p2.BackoffUntil != nil {
		t.Fatalf("backoff: group %+v\np0 %+v\np1 %+v\np2 %+v", g, p0, p1, p2)
	}
	// p0: its holder died with a delivery under way; p2: a delivery in
	// flight under a live lease.
	if g.Unanswered != 1 || p0.Unanswered != 1 || p1.Unanswered != 0 || p2.Unanswered != 0 || p2.Deliveries != 2 {
		t.Fatalf("unanswered: group %d, partitions %d %d %d", g.Unanswered, p0.Unanswered, p1.Unanswered, p2.Unanswered)
	}
	// p1: four messages left to deliver alone after a crash nobody could
	// be charged for.
	if p0.Suspects != 0 || p1.Suspects != 4 || p2.Suspects != 0 {
		t.Fatalf("suspects: partitions %d %d %d", p0.Suspects, p1.Suspects, p2.Suspects)
	}
	js, err := json.Marshal(p0)
	if err != nil || !strings.Contains(string(js), `"deliveries":3`) || !strings.Contains(string(js), `"unanswered":1`) ||
		!strings.Contains(string(js), `"backing_off":true`) || !strings.Contains(string(js), `"backoff_until":`) {
		t.Fatalf("json %s, %v", js, err)
	}
}

// Failure mode 6's status side: each group's live members and last
// activity, who cannot take a message out of the stream, and who holds
// retention back, whatever the filter.
func TestStatusShowsMembersActivityAndWhoHoldsRetention(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 2)
	e.PublishN("orders", 10, "m") // 5 per partition
	e.SequenceAll()
	s := e.Schema
	e.Exec(`INSERT INTO ` + s + `.cursors (group_name, topic, partition, seq, updated_at, lease_owner, lease_expires_at) VALUES
		('gone', 'orders', 0, 0, now() - interval '3 days', NULL, NULL), ('gone', 'orders', 1, 0, now() - interval '3 days', NULL, NULL),
		('live', 'orders', 0, 5, now(), 'live-a', now() + interval '1 minute'), ('live', 'orders', 1, 3, now(), 'live-b', now() + interval '1 minute')`)
	e.Exec(`INSERT INTO ` + s + `.members (group_name, topic, member_id, joined_at, heartbeat_at, can_reject) VALUES
		('gone', 'orders', 'gone-1', now() - interval '5 days', now() - interval '2 days', true),
		('live', 'orders', 'live-a', now() - interval '1 hour', now(), false),
		('live', 'orders', 'live-b', now() - interval '1 hour', now(), true),
		('ghost', 'orders', 'ghost-1', now(), now(), true)`)

	// Filtered to the live group: it does not hold retention back, gone
	// does, though gone is not reported.
	rep, err := e.admin.Status(outboxtest.Ctx(t), admin.Filter{Group: "live"})
	if err != nil {
		t.Fatal(err)
	}
	topic := rep.Topics[0]
	if topic.RetentionHeldBy != "gone" || len(topic.Groups) != 1 {
		t.Fatalf("filtered to live: retention held by %q, groups %d; want gone, 1", topic.RetentionHeldBy, len(topic.Groups))
	}
	live := topic.Groups[0]
	if live.HoldsRetention || live.Partitions[0].HoldsRetention || live.Partitions[1].HoldsRetention {
		t.Fatalf("live said to hold retention: %+v", live)
	}
	if len(live.Members) != 2 || live.Members[0].MemberID != "live-a" || live.Members[0].CanReject || !live.Members[1].CanReject ||
		time.Since(live.Members[0].JoinedAt) < 50*time.Minute || time.Since(live.Members[0].HeartbeatAt) > time.Minute {
		t.Fatalf("live members %+v", live.Members)
	}
	if live.CannotReject != 1 || !live.RetriesForever || !live.Partitions[0].RetriesForever || live.Partitions[1].RetriesForever {
		t.Fatalf("live: cannot reject %d, retries forever %v, partitions %v %v; want 1, true, only partition 0 (held by live-a)",
			live.CannotReject, live.RetriesForever, live.Partitions[0].RetriesForever, live.Partitions[1].RetriesForever)
	}

	rep, err = e.admin.Status(outboxtest.Ctx(t), admin.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	topic = rep.Topics[0]
	var names []string
	for _, g := range topic.Groups {
		names = append(names, g.Group)
	}
	if fmt.Sprint(names) != "[ghost gone live]" {
		t.Fatalf("groups %v, want ghost (members only), gone, live", names)
	}
	ghost, gone := topic.Groups[0], topic.Groups[1]
	if !gone.HoldsRetention || !gone.Partitions[0].HoldsRetention || !gone.Partitions[1].HoldsRetention || len(gone.Members) != 0 ||
		gone.RetriesForever || gone.LastActivity == nil || time.Since(*gone.LastActivity) < 47*time.Hour || time.Since(*gone.LastActivity) > 49*time.Hour {
		t.Fatalf("gone: %+v; want holding retention in both partitions, no live member, last activity its dead member's heartbeat 2 days ago", gone)
	}
	if len(ghost.Members) != 1 || len(ghost.Partitions) != 0 || ghost.HoldsRetention || ghost.LastActivity == nil {
		t.Fatalf("ghost: %+v; want a live member and no partitions", ghost)
	}
	js, err := json.Marshal(gone)
	if err != nil || !strings.Contains(string(js), `"members":[]`) || !strings.Contains(string(js), `"holds_retention":true`) ||
		!strings.Contains(string(js), `"last_activity":`) {
		t.Fatalf("json %s, %v", js, err)
	}
	if js, _ = json.Marshal(live.Members[0]); !strings.Contains(string(js), `"can_reject":false`) || !strings.Contains(string(js), `"joined_at":`) {
		t.Fatalf("member json %s", js)
	}
}

func TestResetCursorRefusesTheZeroPosition(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	e.PublishN("orders", 5, "m")
	e.SequenceAll()
	e.Exec(`INSERT INTO ` + e.Schema + `.cursors (group_name, topic, partition, seq) VALUES ('g', 'orders', 0, 5)`)
	if _, err := e.admin.ResetCursor(outboxtest.Ctx(t), admin.Scope{Group: "g", Topic: "orders"}, admin.Position{}); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("ResetCursor(Position{}) = %v, want ErrInvalidArgument", err)
	}
	if seq, _, _ := e.Cursor("g", "orders", 0); seq != 5 {
		t.Fatalf("cursor at %d after a refused reset, want 5", seq)
	}
	if _, err := e.admin.ResetCursor(outboxtest.Ctx(t), admin.Scope{Group: "g", Topic: "orders"}, admin.ToSeq(0)); err != nil {
		t.Fatalf("ResetCursor(ToSeq(0)): %v", err)
	}
	if seq, _, _ := e.Cursor("g", "orders", 0); seq != 0 {
		t.Fatalf("cursor at %d after ToSeq(0)", seq)
	}
}

func TestAdminAndRetentionRefuseUnmigratedAndNewerSchemas(t *testing.T) {
	pool := pgtest.Pool(t)
	fresh := pgtest.Schema(t)
	a, err := admin.New(admin.Config{Schema: fresh, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := retention.NewVacuum(retention.Config{Schema: fresh, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	calls := func(a *admin.Admin, v *retention.Vacuum) map[string]error {
		scope := admin.Scope{Group: "g", Topic: "orders"}
		_, status := a.Status(outboxtest.Ctx(t), admin.Filter{})
		_, pause := a.Pause(outboxtest.Ctx(t), scope)
		_, resume := a.Resume(outboxtest.Ctx(t), scope)
		_, reset := a.ResetCursor(outboxtest.Ctx(t), scope, admin.ToSeq(0))
		_, del := a.DeleteGroup(outboxtest.Ctx(t), "g", admin.DeleteGroupOptions{})
		_, vac := v.VacuumOnce(outboxtest.Ctx(t))
		ctx, cancel := context.WithTimeout(outboxtest.Ctx(t), 5*time.Second)
		defer cancel()
		run := v.Run(ctx)
		return map[string]error{"Status": status, "Pause": pause, "Resume": resume, "ResetCursor": reset, "DeleteGroup": del,
			"VacuumOnce": vac, "Run": run}
	}
	for name, err := range calls(a, v) {
		if !errors.Is(err, outbox.ErrNotMigrated) {
			t.Errorf("%s on an unmigrated schema: %v, want ErrNotMigrated", name, err)
		}
	}

	e := newEnv(t)
	e.Exec("INSERT INTO "+e.Schema+".schema_migrations (version, name) VALUES ($1, 'future')", outbox.SchemaVersion+1)
	pool2 := pgtest.Pool(t) // not checked yet
	a2, err := admin.New(admin.Config{Schema: e.Schema, Pool: pool2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := retention.NewVacuum(retention.Config{Schema: e.Schema, Pool: pool2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v2.Close()
	for name, err := range calls(a2, v2) {
		if !errors.Is(err, outbox.ErrSchemaTooNew) {
			t.Errorf("%s on a newer schema: %v, want ErrSchemaTooNew", name, err)
		}
	}
	var n int
	if err := pool2.QueryRow(context.Background(), "SELECT count(*) FROM "+e.Schema+".cursors").Scan(&n); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d cursor rows written into a newer schema", n)
	}
}

// What counts as live for DeleteGroup: a recent heartbeat, or an
// unexpired lease even without a member row; a stale heartbeat and an
// expired lease do not.
func TestDeleteGroupLiveness(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 2)
	s := e.Schema
	e.Exec(`INSERT INTO ` + s + `.cursors (group_name, topic, partition, lease_owner, lease_expires_at) VALUES
		('leased', 'orders', 0, 'zombie-1', now() + interval '1 minute'), ('leased', 'orders', 1, NULL, NULL),
		('stale', 'orders', 0, 'old-1', now() - interval '1 minute'), ('stale', 'orders', 1, NULL, NULL)`)
	e.Exec(`INSERT INTO ` + s + `.members (group_name, topic, member_id, heartbeat_at) VALUES
		('stale', 'orders', 'old-1', now() - interval '5 minutes'),
		('joining', 'orders', 'new-1', now())`) // a member whose cursors are not created yet

	var active *admin.GroupActiveError
	_, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "leased", admin.DeleteGroupOptions{})
	if !errors.As(err, &active) || !errors.Is(err, admin.ErrGroupActive) || fmt.Sprint(active.Members) != "[zombie-1]" || active.LeasedPartitions != 1 {
		t.Fatalf("DeleteGroup(leased) = %v, want ErrGroupActive naming zombie-1 and 1 leased partition", err)
	}
	if !strings.Contains(err.Error(), "Force") {
		t.Fatalf("the error does not say what to do: %v", err)
	}
	if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "joining", admin.DeleteGroupOptions{}); !errors.As(err, &active) || fmt.Sprint(active.Members) != "[new-1]" {
		t.Fatalf("DeleteGroup(joining) = %v, want ErrGroupActive naming new-1", err)
	}
	if n := e.Int(`SELECT count(*) FROM ` + s + `.cursors WHERE group_name = 'leased'`); n != 2 {
		t.Fatalf("a refused delete removed cursors: %d left", n)
	}
	got, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "stale", admin.DeleteGroupOptions{})
	if err != nil || got.Cursors != 2 || got.Members != 1 {
		t.Fatalf("DeleteGroup(stale) = %+v, %v; want 2 cursors and 1 member deleted", got, err)
	}
	if got, err = e.admin.DeleteGroup(outboxtest.Ctx(t), "leased", admin.DeleteGroupOptions{Force: true}); err != nil || got.Cursors != 2 {
		t.Fatalf("forced DeleteGroup(leased) = %+v, %v", got, err)
	}
	if got, err = e.admin.DeleteGroup(outboxtest.Ctx(t), "joining", admin.DeleteGroupOptions{Force: true}); err != nil || got.Members != 1 || got.Cursors != 0 {
		t.Fatalf("forced DeleteGroup(joining) = %+v, %v", got, err)
	}
	for _, group := range []string{"stale", "leased", "joining"} {
		if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), group, admin.DeleteGroupOptions{}); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("DeleteGroup(%s) again = %v, want ErrNotFound", group, err)
		}
	}
	if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "", admin.DeleteGroupOptions{}); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("DeleteGroup(\"\") = %v, want ErrInvalidArgument", err)
	}
	if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "g", admin.DeleteGroupOptions{Topic: "bad topic"}); !errors.Is(err, outbox.ErrInvalidName) {
		t.Fatalf("DeleteGroup with a bad topic = %v, want ErrInvalidName", err)
	}
}

// Topic limits the deletion; dead letters stay unless asked for, and then
// only the scope's go.
func TestDeleteGroupOneTopicAndItsDeadLetters(t *testing.T) {
	e := newEnv(t)
	e.Register("a", 1)
	e.Register("b", 1)
	s := e.Schema
	e.Exec(`INSERT INTO ` + s + `.cursors (group_name, topic, partition) VALUES ('g', 'a', 0), ('g', 'b', 0), ('other', 'a', 0)`)
	e.Exec(`INSERT INTO ` + s + `.members (group_name, topic, member_id, heartbeat_at) VALUES
		('g', 'a', 'm-a', now() - interval '1 hour'), ('g', 'b', 'm-b', now() - interval '1 hour')`)
	e.Exec(`INSERT INTO ` + s + `.dead_letters (group_name, topic, partition, seq, uuid, metadata, payload, reason, first_failure_at, last_failure_at) VALUES
		('g', 'a', 0, 1, 'u1', '{}', '', 'boom', now(), now()), ('g', 'a', 0, 2, 'u2', '{}', '', 'boom', now(), now()),
		('g', 'b', 0, 1, 'u3', '{}', '', 'boom', now(), now()), ('other', 'a', 0, 1, 'u4', '{}', '', 'boom', now(), now())`)

	if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "g", admin.DeleteGroupOptions{Topic: "nope"}); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("DeleteGroup on a topic the group does not consume = %v, want ErrNotFound", err)
	}
	got, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "g", admin.DeleteGroupOptions{Topic: "a"})
	if err != nil || got != (admin.DeletedGroup{Group: "g", Topic: "a", Cursors: 1, Members: 1}) {
		t.Fatalf("DeleteGroup(g, topic a) = %+v, %v", got, err)
	}
	if n := e.Int(`SELECT count(*) FROM ` + s + `.cursors WHERE group_name = 'g' AND topic = 'b'`); n != 1 {
		t.Fatalf("g's cursor on b deleted too (%d left)", n)
	}
	if n := e.Int(`SELECT count(*) FROM ` + s + `.dead_letters`); n != 4 {
		t.Fatalf("%d dead letters left, want all 4 kept by default", n)
	}
	got, err = e.admin.DeleteGroup(outboxtest.Ctx(t), "g", admin.DeleteGroupOptions{DeadLetters: true})
	if err != nil || got.Cursors != 1 || got.Members != 1 || got.DeadLetters != 3 {
		t.Fatalf("DeleteGroup(g, dead letters) = %+v, %v; want b's cursor and member and g's 3 dead letters", got, err)
	}
	if n := e.Int(`SELECT count(*) FROM ` + s + `.dead_letters WHERE group_name = 'other'`); n != 1 {
		t.Fatalf("another group's dead letter deleted")
	}
	if n := e.Int(`SELECT count(*) FROM ` + s + `.cursors WHERE group_name = 'other'`); n != 1 {
		t.Fatalf("another group's cursor deleted")
	}
	// The dead letters of a group deleted earlier can go on their own.
	if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "other", admin.DeleteGroupOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "other", admin.DeleteGroupOptions{}); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("DeleteGroup(other) again = %v, want ErrNotFound", err)
	}
	if got, err = e.admin.DeleteGroup(outboxtest.Ctx(t), "other", admin.DeleteGroupOptions{DeadLetters: true}); err != nil || got.DeadLetters != 1 {
		t.Fatalf("DeleteGroup(other, dead letters) = %+v, %v; want its dead letter", got, err)
	}
}

// The deletion is one locked transaction: while a transaction holds one
// of the group's cursor rows, a forced delete waits and removes nothing,
// then everything; a refusal does not wait for the lock.
func TestDeleteGroupIsAllOrNothing(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 2)
	s := e.Schema
	e.Exec(`INSERT INTO ` + s + `.cursors (group_name, topic, partition, lease_owner, lease_expires_at) VALUES
		('g', 'orders', 0, NULL, NULL), ('g', 'orders', 1, 'w-1', now() + interval '1 minute')`)
	e.Exec(`INSERT INTO ` + s + `.members (group_name, topic, member_id) VALUES ('g', 'orders', 'w-1')`)

	// A worker's transaction holds partition 1's row, as a Transactional
	// batch does.
	tx, err := e.Pool.Begin(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(outboxtest.Ctx(t), `SELECT 1 FROM `+s+`.cursors WHERE group_name = 'g' AND partition = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	refused := make(chan error, 1)
	go func() {
		_, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "g", admin.DeleteGroupOptions{})
		refused <- err
	}()
	select {
	case err := <-refused:
		if !errors.Is(err, admin.ErrGroupActive) {
			t.Fatalf("DeleteGroup(g) = %v, want ErrGroupActive", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a refused DeleteGroup waited for the worker's transaction")
	}

	forced := make(chan error, 1)
	go func() {
		_, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "g", admin.DeleteGroupOptions{Force: true})
		forced <- err
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-forced:
		t.Fatalf("a forced DeleteGroup did not wait for the row lock: %v", err)
	default:
	}
	if c, m := e.Int(`SELECT count(*) FROM `+s+`.cursors`), e.Int(`SELECT count(*) FROM `+s+`.members`); c != 2 || m != 1 {
		t.Fatalf("half deleted while waiting: %d cursors, %d members", c, m)
	}
	if err := tx.Rollback(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-forced; err != nil {
		t.Fatal(err)
	}
	if c, m := e.Int(`SELECT count(*) FROM `+s+`.cursors`), e.Int(`SELECT count(*) FROM `+s+`.members`); c != 0 || m != 0 {
		t.Fatalf("after the forced delete: %d cursors, %d members", c, m)
	}
}

// A schema dropped after the (cached) check: every call says
// ErrNotMigrated, not "relation does not exist".
func TestAdminOnADroppedSchema(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	e.Exec(`INSERT INTO ` + e.Schema + `.cursors (group_name, topic, partition) VALUES ('g', 'orders', 0)`)
	if _, err := e.admin.Status(outboxtest.Ctx(t), admin.Filter{}); err != nil { // caches the check
		t.Fatal(err)
	}
	e.Exec("DROP SCHEMA " + e.Schema + " CASCADE")
	scope := admin.Scope{Group: "g", Topic: "orders"}
	_, status := e.admin.Status(outboxtest.Ctx(t), admin.Filter{})
	_, pause := e.admin.Pause(outboxtest.Ctx(t), scope)
	_, resume := e.admin.Resume(outboxtest.Ctx(t), scope)
	_, reset := e.admin.ResetCursor(outboxtest.Ctx(t), scope, admin.ToSeq(0))
	_, del := e.admin.DeleteGroup(outboxtest.Ctx(t), "g", admin.DeleteGroupOptions{})
	_, forced := e.admin.DeleteGroup(outboxtest.Ctx(t), "g", admin.DeleteGroupOptions{Force: true})
	for name, err := range map[string]error{"Status": status, "Pause": pause, "Resume": resume, "ResetCursor": reset,
		"DeleteGroup": del, "DeleteGroup(Force)": forced} {
		if !errors.Is(err, outbox.ErrNotMigrated) {
			t.Errorf("%s on a dropped schema: %v, want ErrNotMigrated", name, err)
		}
	}
}
