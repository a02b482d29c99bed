package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/admin"
)

// An operator's session: pause a partition that keeps failing, look at the
// status, replay the last hour of another partition, resume.
func ExampleAdmin() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	a, err := admin.New(admin.Config{Pool: pool}, watermill.NewStdLogger(false, false))
	if err != nil {
		log.Fatal(err)
	}

	billing7 := admin.Scope{Group: "billing", Topic: "orders", Partitions: []int{7}}
	if _, err := a.Pause(ctx, billing7); err != nil {
		log.Fatal(err)
	}

	report, err := a.Status(ctx, admin.Filter{Group: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	_ = json.NewEncoder(os.Stdout).Encode(report) // lag, leases, errors, dead letters

	resets, err := a.ResetCursor(ctx, admin.Scope{Group: "billing", Topic: "orders", Partitions: []int{3}},
		admin.ToTime(time.Now().Add(-time.Hour)))
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range resets {
		log.Printf("partition %d: cursor %d -> %d", r.Partition, r.From, r.To)
	}

	if _, err := a.Resume(ctx, billing7); err != nil {
		log.Fatal(err)
	}
}

// Deleting a consumer group nobody runs any more, so that the retention
// vacuum can free what only it kept.
func ExampleAdmin_DeleteGroup() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	a, err := admin.New(admin.Config{Pool: pool}, nil)
	if err != nil {
		log.Fatal(err)
	}
	deleted, err := a.DeleteGroup(ctx, "old-billing", admin.DeleteGroupOptions{})
	var active *admin.GroupActiveError
	switch {
	case errors.As(err, &active):
		log.Printf("still running: stop %v first (or use Force)", active.Members)
	case err != nil:
		log.Fatal(err)
	default:
		log.Printf("deleted %d cursors", deleted.Cursors)
	}
}

// What an operator looks for in the status: groups that hold retention
// back with nobody consuming for them (likely abandoned), groups that
// retry a poison message for ever, and partitions stuck on a message that
// fails, crashes its consumer or waits out a backoff.
func ExampleAdmin_Status() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	a, err := admin.New(admin.Config{Pool: pool}, nil)
	if err != nil {
		log.Fatal(err)
	}
	report, err := a.Status(ctx, admin.Filter{})
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range report.Topics {
		for _, g := range t.Groups {
			if g.HoldsRetention && len(g.Members) == 0 {
				log.Printf("%s/%s holds retention back with no live member (last activity %v): admin.DeleteGroup if it is abandoned",
					t.Topic, g.Group, g.LastActivity)
			}
			if g.RetriesForever {
				log.Printf("%s/%s: %d member(s) without a RejectHandler retry a poison message for ever", t.Topic, g.Group, g.CannotReject)
			}
			for _, p := range g.Partitions {
				if p.Attempts > 0 || p.Unanswered > 0 {
					log.Printf("%s/%s/%d: seq %d failed %d time(s), %d deliveries ended without an outcome, backing off: %v (%s)",
						t.Topic, g.Group, p.Partition, p.Cursor+1, p.Attempts, p.Unanswered, p.BackingOff, p.LastError)
				}
			}
		}
	}
}
