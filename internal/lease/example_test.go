package lease_test

import (
	"context"
	"errors"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/lease"
)

// handleAfter stands for the application's work: handle the partition's
// messages after seq and return the seq of the last one handled.
func handleAfter(ctx context.Context, partition int, seq int64) (int64, error) { return seq, nil }

// A member of the consumer group "billing" on the 16 partitions of
// "orders": one worker per leased partition, each moving the group's cursor
// under its lease.
func ExampleManager() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	m, err := lease.NewManager(lease.Config{Pool: pool, Group: "billing", Topic: "orders", Partitions: 16},
		watermill.NewStdLogger(false, false))
	if err != nil {
		log.Fatal(err)
	}
	// Run returns once ctx ends and every worker called Done (or TTL passed).
	err = m.Run(ctx, func(l *lease.Lease) {
		go func() {
			defer l.Done() // the manager releases the lease only after this
			ctx, cursor := l.Context(), l.Cursor()
			for {
				last, err := handleAfter(ctx, l.Partition(), cursor)
				if err == nil && last > cursor {
					err = l.Advance(ctx, nil, last)
					if errors.Is(err, lease.ErrLeaseLost) {
						return // another member owns the partition now
					}
					if err == nil {
						cursor = last
					}
				}
				select {
				case <-ctx.Done(): // lost, given back, or the manager stops
					return
				case <-time.After(time.Second):
				}
			}
		}()
	})
	if err != nil {
		log.Fatal(err)
	}
}
