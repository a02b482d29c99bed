// Command read-model shows a transactional consumer keeping a read model
// exactly once: the handler's writes commit in the same transaction as the
// consumer group's cursor, so a message is counted once even when handlers
// fail halfway and when the consumer is stopped in the middle and another
// instance takes over.
//
//	go run ./_examples/read-model
//
// No setup: PostgreSQL is a throwaway server. The last line printed is OK.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/deadletter"
)

const (
	customers = 12
	orders    = 600
)

type orderPlaced struct {
	OrderID    int    `json:"order_id"`
	Customer   string `json:"customer"`
	TotalCents int64  `json:"total_cents"`
}

func main() { exampledb.Main(run) }

func run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	db, err := exampledb.Start(ctx)
	if err != nil {
		return err
	}
	defer db.Stop()
	logger := exampledb.Logger()
	if err := outbox.RegisterTopic(ctx, db.Pool, outbox.DefaultSchema, "orders", 4); err != nil {
		return err
	}
	if _, err := db.Pool.Exec(ctx, `
		CREATE TABLE orders (id integer PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL);
		CREATE TABLE customer_totals (customer text PRIMARY KEY, orders integer NOT NULL, total_cents bigint NOT NULL)`); err != nil {
		return err
	}

	// The write side: each order and its event in one transaction.
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: db.Pool}, logger)
	if err != nil {
		return err
	}
	for id := 1; id <= orders; id++ {
		ev := orderPlaced{OrderID: id, Customer: "customer-" + strconv.Itoa(id%customers), TotalCents: int64(100 + id)}
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, $2, $3)`, ev.OrderID, ev.Customer, ev.TotalCents); err != nil {
				return err
			}
			payload, _ := json.Marshal(ev)
			msg := message.NewMessage(watermill.NewUUID(), payload)
			msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, ev.Customer)
			msg.SetContext(outbox.WithTx(ctx, tx))
			return pub.Publish("orders", msg)
		})
		if err != nil {
			return err
		}
	}
	fmt.Printf("placed %d orders of %d customers\n", orders, customers)

	// The read side: two instances of the consumer, one after the other.
	var handled, failed atomic.Int64
	first, err := startConsumer(ctx, db, logger, &handled, &failed)
	if err != nil {
		return err
	}
	for handled.Load() < orders/3 {
		time.Sleep(5 * time.Millisecond)
	}
	// Stop the first instance in the middle of the stream: batches not yet
	// committed are rolled back, read model and cursor alike.
	_ = first.Close()
	fmt.Printf("first consumer stopped after %d handler runs\n", handled.Load())
	second, err := startConsumer(ctx, db, logger, &handled, &failed)
	if err != nil {
		return err
	}
	defer second.Close()

	// Wait until the read model has every order once.
	for {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce(sum(orders), 0) FROM customer_totals`).Scan(&n); err != nil {
			return err
		}
		if n == orders {
			break
		}
		if n > orders {
			return fmt.Errorf("read model counts %d orders of %d", n, orders)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("read model counts %d orders of %d: %w", n, orders, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	time.Sleep(300 * time.Millisecond) // nothing may be counted twice later
	var mismatches int
	err = db.Pool.QueryRow(ctx, `
		SELECT count(*) FROM (SELECT customer, count(*) AS orders, sum(total_cents) AS total_cents FROM orders GROUP BY customer) o
		FULL JOIN customer_totals t USING (customer)
		WHERE o.orders IS DISTINCT FROM t.orders OR o.total_cents IS DISTINCT FROM t.total_cents`).Scan(&mismatches)
	if err != nil {
		return err
	}
	if mismatches != 0 {
		return fmt.Errorf("%d customers differ between orders and the read model", mismatches)
	}
	fmt.Printf("read model exact for %d customers: %d handler runs for %d orders (%d failed on purpose and were undone)\n",
		customers, handled.Load(), orders, failed.Load())
	return nil
}

var errFlaky = errors.New("flaky handler")

// startConsumer starts an instance of the read-model consumer.
func startConsumer(ctx context.Context, db *exampledb.DB, logger watermill.LoggerAdapter, handled, failed *atomic.Int64) (*outbox.Subscriber, error) {
	deadLetters, err := deadletter.NewStore(deadletter.Config{Pool: db.Pool}, logger)
	if err != nil {
		return nil, err
	}
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
		Pool:          db.Pool,
		ConsumerGroup: "customer-totals",
		Strategy:      outbox.Transactional,
		Tuning:        adaptive.LowLatency(), // retries after 100 ms rather than 1 s
		// A message that fails 5 times goes to the dead-letter store, in
		// the transaction that moves the cursor past it, instead of
		// stalling its partition. (The flaky failures below fail once.)
		RejectHandler: deadLetters,
		MaxAttempts:   5,
	}, logger)
	if err != nil {
		return nil, err
	}
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		return nil, err
	}
	go func() {
		for msg := range msgs {
			handled.Add(1)
			if err := handle(msg); err != nil {
				if errors.Is(err, errFlaky) {
					failed.Add(1)
				}
				msg.Nack()
				continue
			}
			msg.Ack()
		}
	}()
	return sub, nil
}

// handle adds an order to its customer's totals, in the transaction the
// Subscriber opened for the batch.
func handle(msg *message.Message) error {
	tx, ok := outbox.TxFromContext[pgx.Tx](msg.Context())
	if !ok {
		return errors.New("no transaction: the Subscriber must use the Transactional strategy")
	}
	var ev orderPlaced
	if err := json.Unmarshal(msg.Payload, &ev); err != nil {
		return err
	}
	ctx := msg.Context()
	_, err := tx.Exec(ctx, `
		INSERT INTO customer_totals (customer, orders, total_cents) VALUES ($1, 1, $2)
		ON CONFLICT (customer) DO UPDATE SET orders = customer_totals.orders + 1,
			total_cents = customer_totals.total_cents + EXCLUDED.total_cents`, ev.Customer, ev.TotalCents)
	if err != nil {
		return err
	}
	// Every 13th order fails on its first delivery, after its write: the
	// Subscriber rolls the write back (savepoint) and delivers it again.
	if ev.OrderID%13 == 0 && msg.Metadata.Get(outbox.MetadataAttempt) == "1" {
		return errFlaky
	}
	return nil
}
