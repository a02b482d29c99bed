package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
)

// process stands for the application's handler logic.
func process(*message.Message) error { return errors.New("unparseable payload") }

// A Router whose handler failures go to the dead-letter store through
// Watermill's PoisonQueue middleware; the outbox Subscriber stores them in
// the transaction that moves its cursor past them. Later, an operator
// replays what was fixed.
func ExampleStore_PoisonPublisher() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	logger := watermill.NewStdLogger(false, false)

	store, err := deadletter.NewStore(deadletter.Config{Pool: pool}, logger)
	if err != nil {
		log.Fatal(err)
	}
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
		Pool:          pool,
		ConsumerGroup: "billing",
		RejectHandler: store, // stores rejected messages as the cursor moves
		MaxAttempts:   5,     // and those that failed 5 times
	}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	poisonQueue, err := middleware.PoisonQueue(store.PoisonPublisher(), "dead_letters")
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(poisonQueue)
	router.AddConsumerHandler("billing", "orders", sub, process)
	go func() { _ = router.Run(ctx) }()
	defer router.Close()

	// ... later: replay the pending dead letters of the last hour.
	page, err := store.List(ctx, deadletter.ListOptions{Filter: deadletter.Filter{
		Group:    "billing",
		Statuses: []deadletter.Status{deadletter.StatusPending},
		From:     time.Now().Add(-time.Hour),
	}})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range page.Entries {
		if _, err := store.Replay(ctx, e.ID, deadletter.ReplayOptions{}); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("replayed %s (%s)\n", e.UUID, e.Reason)
	}
}
