package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// A lease whose cursor row is locked when the member stops (a statement
// of its worker still finishing) is released once the lock goes, not left
// to hold the partition until it expires. Before, the release skipped the
// row, logged it released, and a member that took over waited the TTL.
func TestStopReleasesALeaseWhoseRowWasLocked(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	w := newWorkers(t)
	cfg := e.config("g", "orders", 2)
	cfg.MemberID = "m"
	mb := start(t, cfg, w.onAcquire("m"))
	waitFor(t, "both held", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		return len(o) == 2 && w.has(o), fmt.Sprint(o)
	})
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+e.Schema+`.cursors WHERE group_name = 'g' AND partition = 0 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		mb.stop(t)
	}()
	time.Sleep(testTTL / 4) // the stop's first release finds the row locked
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	<-stopped
	var owners []string
	rows, err := e.Pool.Query(ctx, `SELECT partition || ':' || lease_owner FROM `+e.Schema+`.cursors WHERE group_name = 'g' AND lease_owner IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		owners = append(owners, o)
	}
	if len(owners) > 0 {
		t.Fatalf("leases left after the member stopped: %v; want none, partition 0 released once its row lock went", owners)
	}
}
