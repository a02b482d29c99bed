package retention_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/retention"
)

// warnLogger captures every level, warnings included.
type warnLogger struct {
	*watermill.CaptureLoggerAdapter
	mu    sync.Mutex
	warns []watermill.CapturedMessage
}

func (l *warnLogger) Warn(msg string, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.warns = append(l.warns, watermill.CapturedMessage{Msg: msg, Fields: fields})
}

func (l *warnLogger) warnings() []watermill.CapturedMessage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]watermill.CapturedMessage(nil), l.warns...)
}

// Failure mode 6: a pass says which group holds retention back where, how
// far behind and since when, and warns about one without live members
// (once, not every pass); a live slow group is reported but not warned
// about.
func TestHeldBackNamesTheGroupsAndWarnsAboutAnAbandonedOne(t *testing.T) {
	e := newEnv(t)
	e.Register("t", 2)
	e.publish(t, "t", 10, 0) // 5 per partition
	s := e.Schema
	e.createCursors(t, "gone", "t")
	e.createCursors(t, "slow", "t")
	// gone: stopped at seq 1 of partition 0 three days ago (done with
	// partition 1); slow: a live member, behind in partition 1.
	e.Exec(`UPDATE ` + s + `.cursors SET seq = CASE partition WHEN 0 THEN 1 ELSE 5 END, updated_at = now() - interval '3 days'
		WHERE group_name = 'gone'`)
	e.Exec(`UPDATE ` + s + `.cursors SET seq = CASE partition WHEN 0 THEN 5 ELSE 2 END WHERE group_name = 'slow'`)
	e.Exec(`INSERT INTO ` + s + `.members (group_name, topic, member_id, heartbeat_at, ttl) VALUES
		('slow', 't', 'slow-1', now(), interval '30 seconds'), ('gone', 't', 'gone-1', now() - interval '3 days', interval '300 milliseconds')`)
	e.Exec(`UPDATE ` + s + `.log SET sequenced_at = now() - interval '1 hour' WHERE topic = 't' AND partition = 0 AND seq = 2`)

	logger := &warnLogger{CaptureLoggerAdapter: watermill.NewCaptureLogger()}
	v, err := retention.NewVacuum(retention.Config{Schema: s, Pool: e.Pool}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close() })
	time.Sleep(400 * time.Millisecond) // past gone's join grace (its members' TTL) since the vacuum started
	pass, err := v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if pass.Deleted != 3 { // seq 1 of partition 0, seqs 1-2 of partition 1
		t.Fatalf("deleted %d, want 3", pass.Deleted)
	}
	if len(pass.HeldBack) != 2 {
		t.Fatalf("held back %+v, want gone and slow", pass.HeldBack)
	}
	gone, slow := pass.HeldBack[0], pass.HeldBack[1]
	if gone.Topic != "t" || gone.Group != "gone" || fmt.Sprint(gone.Partitions) != "[0]" || gone.Messages != 4 || gone.LiveMembers != 0 ||
		time.Since(gone.LastActivity) < 70*time.Hour || time.Since(gone.OldestAt) < 50*time.Minute || time.Since(gone.OldestAt) > 2*time.Hour {
		t.Fatalf("first holder %+v: want gone, partition 0, 4 messages behind since an hour, idle for 3 days", gone)
	}
	if slow.Group != "slow" || fmt.Sprint(slow.Partitions) != "[1]" || slow.Messages != 3 || slow.LiveMembers != 1 {
		t.Fatalf("second holder %+v: want slow, partition 1, 3 messages, 1 live member", slow)
	}
	warns := logger.warnings()
	if len(warns) != 1 || !strings.Contains(warns[0].Msg, "without live members holds retention back") ||
		warns[0].Fields["group"] != "gone" || warns[0].Fields["topic"] != "t" || warns[0].Fields["messages_behind"] != int64(4) ||
		warns[0].Fields["schema"] != s || fmt.Sprint(warns[0].Fields["partitions"]) != "[0]" {
		t.Fatalf("warnings %+v: want one about gone", warns)
	}
	if errs := logger.Captured()[watermill.ErrorLogLevel]; len(errs) != 0 {
		t.Fatalf("errors logged: %+v", errs)
	}

	// The next pass reports the same and does not warn again.
	if pass, err = v.VacuumOnce(outboxtest.Ctx(t)); err != nil || len(pass.HeldBack) != 2 || pass.Deleted != 0 {
		t.Fatalf("second pass %+v, %v", pass, err)
	}
	if n := len(logger.warnings()); n != 1 {
		t.Fatalf("%d warnings after two passes, want 1", n)
	}

	// On a logger without Warn, the warning is an Error.
	plain := watermill.NewCaptureLogger()
	v2, err := retention.NewVacuum(retention.Config{Schema: s, Pool: e.Pool}, plain)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v2.Close() })
	time.Sleep(400 * time.Millisecond)
	if _, err := v2.VacuumOnce(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if errs := plain.Captured()[watermill.ErrorLogLevel]; len(errs) != 1 || errs[0].Fields["group"] != "gone" {
		t.Fatalf("errors logged without Warn: %+v", errs)
	}

	// Once every group is past the messages, nobody holds retention back.
	e.advance(t, "gone", "t", 0)
	e.advance(t, "slow", "t", 0)
	if pass, err = v.VacuumOnce(outboxtest.Ctx(t)); err != nil || len(pass.HeldBack) != 0 || pass.Deleted != 7 {
		t.Fatalf("after both groups caught up: %+v, %v", pass, err)
	}
}

// Run on a schema it cannot work with returns the typed error at once
// instead of logging a failed pass every Interval.
func TestRunRefusesAnUnmigratedOrNewerSchema(t *testing.T) {
	pool := pgtest.Pool(t)
	run := func(schema string) error {
		v, err := retention.NewVacuum(retention.Config{Schema: schema, Pool: pool, Interval: 10 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return v.Run(ctx)
	}
	if err := run(pgtest.Schema(t)); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("Run on an unmigrated schema: %v, want ErrNotMigrated", err)
	}
	e := newEnv(t)
	e.Exec("INSERT INTO "+e.Schema+".schema_migrations (version, name) VALUES ($1, 'future')", outbox.SchemaVersion+1)
	if err := run(e.Schema); !errors.Is(err, outbox.ErrSchemaTooNew) {
		t.Fatalf("Run on a newer schema: %v, want ErrSchemaTooNew", err)
	}
}

// A schema dropped after the (cached) check is ErrNotMigrated, not a raw
// "relation does not exist".
func TestVacuumOnceOnADroppedSchema(t *testing.T) {
	e := newEnv(t)
	e.Register("t", 1)
	v := e.vacuum(t, retention.Config{})
	if _, err := v.VacuumOnce(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	e.Exec("DROP SCHEMA " + e.Schema + " CASCADE")
	if _, err := v.VacuumOnce(outboxtest.Ctx(t)); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("VacuumOnce on a dropped schema: %v, want ErrNotMigrated", err)
	}
}

// A holder's live members are those heard from within their own lease
// TTL, as their heartbeats recorded it: a member whose TTL passed is gone,
// however recent (a MemberTimeout of 30 s counted it live), and one whose
// long TTL has not passed is live, however old its heartbeat.
func TestHoldersCountMembersLiveByTheirOwnTTL(t *testing.T) {
	e := newEnv(t)
	e.Register("t", 1)
	e.publish(t, "t", 4, 0)
	s := e.Schema
	e.createCursors(t, "expired", "t")
	e.createCursors(t, "patient", "t")
	e.Exec(`INSERT INTO ` + s + `.members (group_name, topic, member_id, heartbeat_at, ttl) VALUES
		('expired', 't', 'e-1', now() - interval '2 seconds', interval '1 second'),
		('patient', 't', 'p-1', now() - interval '40 seconds', interval '60 seconds')`)
	v := e.vacuum(t, retention.Config{})
	pass, err := v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]int{}
	for _, h := range pass.HeldBack {
		live[h.Group] = h.LiveMembers
	}
	if len(live) != 2 || live["expired"] != 0 || live["patient"] != 1 {
		t.Fatalf("live members of the holders %v: want expired 0, patient 1", live)
	}
}

// A group whose subscribers are still starting holds retention back without
// live members for a moment; the vacuum does not call it abandoned until it
// has shown no sign of life (a cursor change, a heartbeat, or the vacuum's
// own start, for subscribers started with it) for longer than its members'
// TTL, or the lease's default TTL when no member ever joined.
func TestAGroupStillJoiningIsNotCalledAbandoned(t *testing.T) {
	e := newEnv(t)
	e.Register("t", 1)
	e.publish(t, "t", 4, 0)
	s := e.Schema
	// starting: its cursor rows were just made (a subscriber joining),
	// no member row yet. restarted: idle for a day, a member TTL of 300 ms,
	// its subscriber starting with this vacuum.
	e.createCursors(t, "starting", "t")
	e.createCursors(t, "restarted", "t")
	e.Exec(`UPDATE ` + s + `.cursors SET updated_at = now() - interval '1 day' WHERE group_name = 'restarted'`)
	e.Exec(`INSERT INTO ` + s + `.members (group_name, topic, member_id, heartbeat_at, ttl) VALUES
		('restarted', 't', 'r-1', now() - interval '1 day', interval '300 milliseconds')`)
	logger := &warnLogger{CaptureLoggerAdapter: watermill.NewCaptureLogger()}
	v, err := retention.NewVacuum(retention.Config{Schema: s, Pool: e.Pool}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close() })

	pass, err := v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(pass.HeldBack) != 2 {
		t.Fatalf("held back %+v, want starting and restarted (reported, whatever their state)", pass.HeldBack)
	}
	if w := logger.warnings(); len(w) != 0 {
		t.Fatalf("warned %+v at start-up, while both groups may still be joining", w)
	}

	// Past restarted's grace (300 ms since the vacuum started) it is gone;
	// starting, touched just now and with no member row, has 30 s.
	time.Sleep(400 * time.Millisecond)
	if _, err := v.VacuumOnce(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	w := logger.warnings()
	if len(w) != 1 || w[0].Fields["group"] != "restarted" {
		t.Fatalf("warnings %+v, want one about restarted only", w)
	}
}
