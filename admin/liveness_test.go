package admin_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// A member is live while its last heartbeat is within its own lease TTL,
// as its heartbeat recorded it on its row: Status and DeleteGroup need no
// timeout of their own (they used a MemberTimeout of 30 s, whatever the
// members' TTL, so a crashed member with a 1 s TTL counted 30 s, and one
// with a 60 s TTL stopped counting while its leases were still valid).
func TestMemberLivenessIsEachMembersOwnTTL(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	s := e.Schema
	e.Exec(`INSERT INTO ` + s + `.cursors (group_name, topic, partition) VALUES ('short', 'orders', 0), ('long', 'orders', 0)`)
	e.Exec(`INSERT INTO ` + s + `.members (group_name, topic, member_id, heartbeat_at, ttl) VALUES
		('short', 'orders', 'short-1', now() - interval '2 seconds', interval '1 second'),
		('long', 'orders', 'long-1', now() - interval '40 seconds', interval '60 seconds')`)

	rep, err := e.admin.Status(outboxtest.Ctx(t), admin.Filter{Topic: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	members := map[string]int{}
	for _, g := range rep.Topics[0].Groups {
		members[g.Group] = len(g.Members)
	}
	if members["short"] != 0 || members["long"] != 1 {
		t.Fatalf("live members by group %v: want short 0 (heartbeat 2s ago, TTL 1s), long 1 (40s ago, TTL 60s)", members)
	}

	var active *admin.GroupActiveError
	if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "long", admin.DeleteGroupOptions{}); !errors.As(err, &active) || fmt.Sprint(active.Members) != "[long-1]" {
		t.Fatalf("DeleteGroup(long) = %v, want ErrGroupActive naming long-1", err)
	}
	if _, err := e.admin.DeleteGroup(outboxtest.Ctx(t), "short", admin.DeleteGroupOptions{}); err != nil {
		t.Fatalf("DeleteGroup(short) = %v: its member expired a second ago", err)
	}
}

// A running Subscriber's heartbeat records its lease TTL on its row, and
// a row written without one (a member of an older release, during a
// rolling deploy) counts 30 s, as the old MemberTimeout did.
func TestAHeartbeatRecordsTheMembersLeaseTTL(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	sub := e.Subscriber("g", func(c *outbox.SubscriberConfig) {
		c.DisableSequencer = true
		c.Tuning.LeaseTTL = 1500 * time.Millisecond
	})
	if _, err := sub.Subscribe(outboxtest.Ctx(t), "orders"); err != nil {
		t.Fatal(err)
	}
	var ttl time.Duration
	outboxtest.WaitFor(t, "the member's heartbeat", 10*time.Second, func() bool {
		return e.Pool.QueryRow(outboxtest.Ctx(t), `SELECT ttl FROM `+e.Schema+`.members WHERE group_name = 'g'`).Scan(&ttl) == nil
	})
	if ttl != 1500*time.Millisecond {
		t.Fatalf("members.ttl = %v, want the Subscriber's LeaseTTL 1.5s", ttl)
	}
	e.Exec(`INSERT INTO ` + e.Schema + `.members (group_name, topic, member_id) VALUES ('old', 'orders', 'old-1')`)
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), `SELECT ttl FROM `+e.Schema+`.members WHERE member_id = 'old-1'`).Scan(&ttl); err != nil || ttl != 30*time.Second {
		t.Fatalf("ttl of a row written without one = %v (%v), want 30s", ttl, err)
	}
}
