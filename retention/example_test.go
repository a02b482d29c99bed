package retention_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/retention"
)

// A vacuum next to the subscribers: the log keeps what some group has not
// consumed yet, plus a day of consumed messages for replays.
func ExampleVacuum() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	v, err := retention.NewVacuum(retention.Config{Pool: pool, KeepFor: 24 * time.Hour},
		watermill.NewStdLogger(false, false))
	if err != nil {
		log.Fatal(err)
	}
	defer v.Close()
	if err := v.Run(ctx); err != nil { // until Ctrl-C
		log.Fatal(err)
	}
}

// One pass, and who keeps the log from shrinking: a group whose cursor is
// the lowest, how far behind it is, and whether anyone still consumes for
// it.
func ExampleVacuum_VacuumOnce() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	v, err := retention.NewVacuum(retention.Config{Pool: pool}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer v.Close()
	pass, err := v.VacuumOnce(ctx)
	if err != nil {
		log.Fatal(err) // outbox.ErrNotMigrated: run outbox.Migrate first
	}
	log.Printf("deleted %d log rows", pass.Deleted)
	for _, h := range pass.HeldBack {
		log.Printf("%s: group %s is %d messages behind in partitions %v (oldest sequenced %v), last activity %v, %d live members",
			h.Topic, h.Group, h.Messages, h.Partitions, h.OldestAt, h.LastActivity, h.LiveMembers)
		if h.LiveMembers == 0 {
			log.Printf("  likely abandoned: admin.DeleteGroup(ctx, %q, admin.DeleteGroupOptions{Topic: %q})", h.Group, h.Topic)
		}
	}
}
