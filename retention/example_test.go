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
