package main

// How an application tests a consumer: publish the events its handler
// reads, run the pipeline until nothing is left (outboxtest.RunUntilIdle:
// the sequencer, the group's leases and cursors, the handler called right
// here), then look at the read model. No sleeps, no goroutine left.
// docs/testing.md shows this code (../http-handler/testingdoc_test.go
// checks that it does).
//
//	go test ./_examples/read-model

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/outboxtest"
	"github.com/millrace/watermill-outbox/pgtemp"
)

func TestMain(m *testing.M) { pgtemp.Main(m) }

func testDB(t *testing.T) (*pgxpool.Pool, string) {
	pool, schema := pgtemp.Schema(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE customer_totals (customer text PRIMARY KEY, orders integer NOT NULL, total_cents bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := outbox.RegisterTopic(context.Background(), pool, schema, "orders", 4); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

// publish publishes the events in one transaction, as the write side does.
func publish(t *testing.T, pool *pgxpool.Pool, schema string, evs ...orderPlaced) {
	ctx := context.Background()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var msgs []*message.Message
		for _, ev := range evs {
			payload, _ := json.Marshal(ev)
			m := message.NewMessage(fmt.Sprintf("order-%d", ev.OrderID), payload)
			m.Metadata.Set(outbox.PublishPartitionKeyMetadata, ev.Customer)
			m.SetContext(outbox.WithTx(ctx, tx))
			msgs = append(msgs, m)
		}
		return pub.Publish("orders", msgs...)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestOrdersAddUpInTheCustomerTotals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testDB(t)
	publish(t, pool, schema, orderPlaced{1, "ada", 500}, orderPlaced{2, "bob", 700}, orderPlaced{3, "ada", 250})

	// The consumer's own config, as in startConsumer, and its handler.
	res, err := outboxtest.RunUntilIdle(ctx, outbox.SubscriberConfig{
		Schema: schema, Pool: pool, ConsumerGroup: "customer-totals", Strategy: outbox.Transactional,
	}, "orders", handle) // handle: func(*message.Message) error, your handler
	// res.Acked == 3, res.Last == outboxtest.Idle: now look at the read model
	if err != nil {
		t.Fatal(err)
	}
	if res.Acked != 3 || res.Last != outboxtest.Idle {
		t.Fatalf("RunUntilIdle: %+v", res)
	}
	var orders, cents int64
	if err := pool.QueryRow(ctx, `SELECT orders, total_cents FROM customer_totals WHERE customer = 'ada'`).Scan(&orders, &cents); err != nil {
		t.Fatal(err)
	}
	if orders != 2 || cents != 750 {
		t.Fatalf("ada: %d orders, %d cents; want 2, 750", orders, cents)
	}
}

// Order 13 fails on its first delivery (see handle): the first run stops
// backing off, with the write rolled back; once the backoff is over the
// next run delivers it again, and the totals count it once.
func TestAFailedDeliveryIsRetriedAndCountedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testDB(t)
	publish(t, pool, schema, orderPlaced{13, "ada", 1300})
	cfg := outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "customer-totals", Strategy: outbox.Transactional}
	first, err := outboxtest.RunUntilIdle(ctx, cfg, "orders", handle)
	if err != nil {
		t.Fatal(err)
	}
	if first.Failed != 1 || first.Last != outboxtest.BackingOff || first.RetryIn <= 0 {
		t.Fatalf("first run: %+v", first)
	}
	// Instead of waiting RetryIn, end the backoff as an operator's retry would.
	if _, err := pool.Exec(ctx, `UPDATE cursors SET backoff_until = NULL`); err != nil {
		t.Fatal(err)
	}
	second, err := outboxtest.RunUntilIdle(ctx, cfg, "orders", handle)
	if err != nil {
		t.Fatal(err)
	}
	if second.Acked != 1 || second.Last != outboxtest.Idle {
		t.Fatalf("second run: %+v", second)
	}
	var orders int64
	if err := pool.QueryRow(ctx, `SELECT orders FROM customer_totals WHERE customer = 'ada'`).Scan(&orders); err != nil {
		t.Fatal(err)
	}
	if orders != 1 {
		t.Fatalf("ada: %d orders, want 1 (the failed delivery's write was rolled back)", orders)
	}
}
