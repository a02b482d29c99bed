package lease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
)

// A consumer group's changes are announced on names.MembersChannel, so
// that members which balance seldom (while the group is settled) hear
// them at once: a member joining (its first heartbeat, or the first after
// it expired), leaving, and releasing leases. A plain heartbeat and a
// release of nothing are silent.
func TestTheGroupsChangesAreAnnounced(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	db, err := pgexec.FromDB(e.Pool)
	if err != nil {
		t.Fatal(err)
	}
	s := lease.NewPGStore(db, nil, e.Schema)
	g := lease.Group{Name: "g", Topic: "orders"}
	if err := s.CreateCursors(ctx, g, 4, false); err != nil {
		t.Fatal(err)
	}
	heard := e.Listen(names.MembersChannel(e.Schema))
	expect := func(what string, want ...string) {
		t.Helper()
		if got := heard(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: heard %q, want %q", what, got, want)
		}
	}
	balance := func(member string, ttl time.Duration) lease.Balance {
		t.Helper()
		b, err := s.Balance(ctx, g, member, ttl, 4)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	if b := balance("a", time.Minute); b.OthersExpireIn != 0 {
		t.Errorf("alone: the first other member expires in %v, want 0 (none)", b.OthersExpireIn)
	}
	expect("a joins", "orders:g")
	balance("a", time.Minute)
	expect("a heartbeats")

	b := balance("b", 10*time.Second)
	expect("b joins", "orders:g")
	if b.OthersExpireIn <= 0 || b.OthersExpireIn > time.Minute {
		t.Errorf("b: a expires in %v, want within its TTL (1m)", b.OthersExpireIn)
	}
	if b := balance("a", time.Minute); b.OthersExpireIn <= 0 || b.OthersExpireIn > 10*time.Second {
		t.Errorf("a: b expires in %v, want within its TTL (10s)", b.OthersExpireIn)
	}
	expect("a heartbeats again")

	// a stops heartbeating and expires; its next heartbeat is a join.
	e.Exec(`UPDATE ` + e.Schema + `.members SET heartbeat_at = now() - interval '1 hour' WHERE member_id = 'a'`)
	balance("a", time.Minute)
	expect("a comes back after it expired", "orders:g")

	got, err := s.Acquire(ctx, g, "a", 4, []int32{}, time.Minute, 2)
	if err != nil || len(got) != 2 {
		t.Fatalf("acquire: %v, %v", got, err)
	}
	expect("a acquires")
	parts := []int32{got[0].Partition, got[1].Partition}
	tokens := []int64{got[0].Token, got[1].Token}
	if _, err := s.Release(ctx, g, "a", parts, tokens); err != nil {
		t.Fatal(err)
	}
	expect("a releases two leases", "orders:g")
	if _, err := s.Release(ctx, g, "a", parts, tokens); err != nil {
		t.Fatal(err)
	}
	expect("a releases them again: nothing")

	if err := s.Leave(ctx, g, "b"); err != nil {
		t.Fatal(err)
	}
	expect("b leaves", "orders:g")
	if err := s.Leave(ctx, g, "b"); err != nil {
		t.Fatal(err)
	}
	expect("b leaves again: nothing")
}

// Members that balance seldom still follow the group's changes at once:
// with balances 30 minutes apart, a join, a leave and an announced pause
// and resume (what admin sends) each reach the members within the test's
// wait, which only the notifications can do.
func TestSeldomBalancingMembersFollowTheGroupsChanges(t *testing.T) {
	e := newEnv(t)
	w := newWorkers(t)
	slow := func(id string) lease.Config {
		cfg := e.config("g", "orders", 4)
		cfg.MemberID = id
		cfg.TTL, cfg.RenewInterval = time.Hour, 20*time.Minute
		cfg.BalanceInterval, cfg.MaxBalanceInterval = 30*time.Minute, 30*time.Minute
		return cfg
	}
	start(t, slow("a"), w.onAcquire("a"))
	waitFor(t, "a holds all 4", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		return len(partitionsOf(o, "a")) == 4 && w.has(o), fmt.Sprint(o)
	})

	b := start(t, slow("b"), w.onAcquire("b"))
	waitFor(t, "b joined: 2 each", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		return len(partitionsOf(o, "a")) == 2 && len(partitionsOf(o, "b")) == 2 && w.has(o), fmt.Sprint(o)
	})

	announce := func() {
		e.Exec(fmt.Sprintf(`SELECT pg_notify('%s', '%s')`, names.MembersChannel(e.Schema), names.MembersPayload("g", "orders")))
	}
	e.Exec(`UPDATE ` + e.Schema + `.cursors SET paused = true WHERE group_name = 'g' AND topic = 'orders' AND partition = 1`)
	announce()
	waitFor(t, "paused partition given back", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		_, held := o[1]
		return !held && len(o) == 3, fmt.Sprint(o)
	})
	e.Exec(`UPDATE ` + e.Schema + `.cursors SET paused = false WHERE group_name = 'g' AND topic = 'orders' AND partition = 1`)
	announce()
	waitFor(t, "resumed partition taken: 2 each again", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		return len(partitionsOf(o, "a")) == 2 && len(partitionsOf(o, "b")) == 2 && w.has(o), fmt.Sprint(o)
	})

	b.stop(t)
	waitFor(t, "b left: a holds all 4", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		return len(partitionsOf(o, "a")) == 4 && w.has(o), fmt.Sprint(o)
	})
}
