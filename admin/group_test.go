package admin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/retention"
)

// An abandoned group pins retention; DeleteGroup removes it, but not while
// it is in use.
func TestDeleteGroupIsRefusedWhileLiveAndFreesRetention(t *testing.T) {
	e := newEnv(t)
	e.register(t, "orders", 2)
	e.publish(t, "orders", 20, "m")
	e.sequence(t)

	// "busy" consumes everything; "gone" joined once and stopped at 0.
	busy := e.subscriber(t, "busy")
	rec := &recorder{}
	msgs, err := busy.Subscribe(testCtx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	done := rec.run(msgs)
	waitFor(t, "busy to consume everything and move its cursors", 30*time.Second, func() bool {
		if rec.count() < 20 {
			return false
		}
		var lag int64
		if err := e.pool.QueryRow(testCtx(t), `SELECT coalesce(sum(p.last_seq - c.seq), -1) FROM `+e.schema+`.cursors c
			JOIN `+e.schema+`.partitions p USING (topic, partition) WHERE c.group_name = 'busy'`).Scan(&lag); err != nil {
			t.Fatal(err)
		}
		return lag == 0
	})
	e.exec(t, `INSERT INTO `+e.schema+`.cursors (group_name, topic, partition, updated_at)
		SELECT 'gone', topic, partition, now() - interval '3 days' FROM `+e.schema+`.partitions WHERE topic = 'orders'`)

	rep, err := e.admin.Status(testCtx(t), admin.Filter{Topic: "orders"})
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
			if len(g.Members) != 1 || g.HoldsRetention || !g.RetriesForever || g.Members[0].CanReject {
				t.Fatalf("busy: members %+v, holds %v, retries forever %v", g.Members, g.HoldsRetention, g.RetriesForever)
			}
		}
	}

	// The vacuum keeps everything for "gone", and says so.
	v, err := retention.NewVacuum(retention.Config{Schema: e.schema, Pool: e.pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	pass, err := v.VacuumOnce(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if pass.Deleted != 0 || len(pass.HeldBack) != 1 || pass.HeldBack[0].Group != "gone" || pass.HeldBack[0].Messages != 20 || pass.HeldBack[0].LiveMembers != 0 {
		t.Fatalf("pass %+v: want nothing deleted, held back by gone (20 messages, no live member)", pass)
	}

	// A live group is refused, with its members named.
	var active *admin.GroupActiveError
	if _, err := e.admin.DeleteGroup(testCtx(t), "busy", admin.DeleteGroupOptions{}); !errors.Is(err, admin.ErrGroupActive) || !errors.As(err, &active) || len(active.Members) != 1 {
		t.Fatalf("DeleteGroup(busy) = %v, want ErrGroupActive naming its member", err)
	}
	if _, err := e.admin.DeleteGroup(testCtx(t), "nobody", admin.DeleteGroupOptions{}); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("DeleteGroup(nobody) = %v, want ErrNotFound", err)
	}
	deleted, err := e.admin.DeleteGroup(testCtx(t), "gone", admin.DeleteGroupOptions{})
	if err != nil || deleted.Cursors != 2 {
		t.Fatalf("DeleteGroup(gone) = %+v, %v; want its 2 cursors", deleted, err)
	}
	if pass, err = v.VacuumOnce(testCtx(t)); err != nil || pass.Deleted != 20 || len(pass.HeldBack) != 0 {
		t.Fatalf("after the delete: pass %+v, %v; want the 20 messages deleted", pass, err)
	}

	// Force deletes a live group.
	if deleted, err = e.admin.DeleteGroup(testCtx(t), "busy", admin.DeleteGroupOptions{Force: true}); err != nil || deleted.Cursors != 2 || deleted.Members != 1 {
		t.Fatalf("forced DeleteGroup(busy) = %+v, %v", deleted, err)
	}
	_ = busy.Close()
	done.Wait()
}

// Failure mode 7's status side: the backoff deadline and the delivery
// count of each partition.
func TestStatusShowsBackoffAndDeliveries(t *testing.T) {
	e := newEnv(t)
	e.register(t, "orders", 2)
	e.exec(t, `INSERT INTO `+e.schema+`.cursors (group_name, topic, partition, attempts, deliveries, backoff_until, last_error)
		VALUES ('g', 'orders', 0, 2, 3, now() + interval '1 minute', 'boom'), ('g', 'orders', 1, 0, 0, now() - interval '1 minute', NULL)`)
	rep, err := e.admin.Status(testCtx(t), admin.Filter{Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	g := rep.Topics[0].Groups[0]
	p0, p1 := g.Partitions[0], g.Partitions[1]
	if g.BackingOff != 1 || !p0.BackingOff || p0.BackoffUntil == nil || p0.Deliveries != 3 || p0.Attempts != 2 || p1.BackingOff {
		t.Fatalf("group %+v\np0 %+v\np1 %+v", g, p0, p1)
	}
}

func TestResetCursorRefusesTheZeroPosition(t *testing.T) {
	e := newEnv(t)
	e.register(t, "orders", 1)
	e.publish(t, "orders", 5, "m")
	e.sequence(t)
	e.exec(t, `INSERT INTO `+e.schema+`.cursors (group_name, topic, partition, seq) VALUES ('g', 'orders', 0, 5)`)
	if _, err := e.admin.ResetCursor(testCtx(t), admin.Scope{Group: "g", Topic: "orders"}, admin.Position{}); !errors.Is(err, admin.ErrInvalidArgument) {
		t.Fatalf("ResetCursor(Position{}) = %v, want ErrInvalidArgument", err)
	}
	if seq, _, _ := e.cursor(t, "g", "orders", 0); seq != 5 {
		t.Fatalf("cursor at %d after a refused reset, want 5", seq)
	}
	if _, err := e.admin.ResetCursor(testCtx(t), admin.Scope{Group: "g", Topic: "orders"}, admin.ToSeq(0)); err != nil {
		t.Fatalf("ResetCursor(ToSeq(0)): %v", err)
	}
	if seq, _, _ := e.cursor(t, "g", "orders", 0); seq != 0 {
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
		_, status := a.Status(testCtx(t), admin.Filter{})
		_, pause := a.Pause(testCtx(t), scope)
		_, reset := a.ResetCursor(testCtx(t), scope, admin.ToSeq(0))
		_, del := a.DeleteGroup(testCtx(t), "g", admin.DeleteGroupOptions{})
		_, vac := v.VacuumOnce(testCtx(t))
		return map[string]error{"Status": status, "Pause": pause, "ResetCursor": reset, "DeleteGroup": del, "VacuumOnce": vac}
	}
	for name, err := range calls(a, v) {
		if !errors.Is(err, outbox.ErrNotMigrated) {
			t.Errorf("%s on an unmigrated schema: %v, want ErrNotMigrated", name, err)
		}
	}

	e := newEnv(t)
	e.exec(t, "INSERT INTO "+e.schema+".schema_migrations (version, name) VALUES ($1, 'future')", outbox.SchemaVersion+1)
	pool2 := pgtest.Pool(t) // not checked yet
	a2, err := admin.New(admin.Config{Schema: e.schema, Pool: pool2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := retention.NewVacuum(retention.Config{Schema: e.schema, Pool: pool2}, nil)
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
	if err := pool2.QueryRow(context.Background(), "SELECT count(*) FROM "+e.schema+".cursors").Scan(&n); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d cursor rows written into a newer schema", n)
	}
}
