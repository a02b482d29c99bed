// Command kafka-forwarder shows the outbox forwarder relaying to Kafka:
// orders are written with their OrderPlaced events in one transaction each,
// a Forwarder relays the events to a Kafka topic, and a watermill-kafka
// subscriber reads them, as any Watermill application would.
//
//	go run ./_examples/kafka-forwarder
//
// No setup: PostgreSQL is a throwaway server, Kafka an in-process fake
// cluster (franz-go's kfake). The last line printed is OK.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
)

const (
	partitions = 8 // the same in the outbox and in Kafka: keys land on the same partition number
	customers  = 20
	orders     = 400
)

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

	if err := outbox.RegisterTopic(ctx, db.Pool, outbox.DefaultSchema, "orders", partitions); err != nil {
		return err
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id integer PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL)`); err != nil {
		return err
	}

	// Kafka: one in-process broker with the topic.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "shop.orders"))
	if err != nil {
		return err
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	fmt.Printf("Kafka (kfake) on %v, topic shop.orders with %d partitions\n", brokers, partitions)

	// The forwarder: the outbox topic "orders" goes to Kafka topic
	// "shop.orders". A record Kafka refuses for good (too large, say) goes
	// to the dead-letter store; MaxAttempts stays at the forwarder's
	// default (outbox.RetryForever), so that failed sends during a broker
	// outage never dead-letter a healthy message.
	target, err := kafka.NewTarget(kafka.Config{Brokers: brokers}, logger)
	if err != nil {
		return err
	}
	defer target.Close()
	deadLetters, err := deadletter.NewStore(deadletter.Config{Pool: db.Pool}, logger)
	if err != nil {
		return err
	}
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber:  outbox.SubscriberConfig{Pool: db.Pool, RejectHandler: deadLetters},
		Topics:      []string{"orders"},
		Target:      target,
		TargetTopic: func(topic string) string { return "shop." + topic },
	}, logger)
	if err != nil {
		return err
	}
	fwdDone := make(chan error, 1)
	go func() { fwdDone <- fwd.Run(ctx) }()
	defer func() { _ = fwd.Close(); <-fwdDone }()

	// Place the orders: each one a row and an event, in one transaction.
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: db.Pool}, logger)
	if err != nil {
		return err
	}
	for id := 1; id <= orders; id++ {
		if err := placeOrder(ctx, db.Pool, pub, id, "customer-"+strconv.Itoa(id%customers), int64(id*100)); err != nil {
			return err
		}
	}
	fmt.Printf("placed %d orders of %d customers\n", orders, customers)

	// A Watermill application reading the Kafka topic.
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	// The forwarder writes in Kafka transactions (exactly once): read what
	// they committed only.
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{Brokers: brokers, Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "shop.orders")
	if err != nil {
		return err
	}
	seen := map[string]bool{} // outbox ids: a redelivered copy has the same one
	last := map[string]int{}  // customer -> last order id
	for len(seen) < orders {
		var m *message.Message
		select {
		case m = <-msgs:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d events arrived: %w", len(seen), orders, ctx.Err())
		}
		m.Ack()
		id := m.Metadata.Get(outbox.MetadataID)
		if seen[id] {
			continue // a duplicate (at-least-once): skip it by its stable id
		}
		seen[id] = true
		var ev struct {
			OrderID  int    `json:"order_id"`
			Customer string `json:"customer"`
		}
		if err := json.Unmarshal(m.Payload, &ev); err != nil {
			return err
		}
		if ev.OrderID <= last[ev.Customer] {
			return fmt.Errorf("%s: order %d arrived after order %d", ev.Customer, ev.OrderID, last[ev.Customer])
		}
		last[ev.Customer] = ev.OrderID
		kafkaPartition, _ := wmkafka.MessagePartitionFromCtx(m.Context())
		key, _ := wmkafka.MessageKeyFromCtx(m.Context())
		if p := m.Metadata.Get(outbox.MetadataPartition); p != strconv.Itoa(int(kafkaPartition)) || string(key) != ev.Customer {
			return fmt.Errorf("order %d: outbox partition %s, Kafka partition %d, key %q", ev.OrderID, p, kafkaPartition, key)
		}
	}
	st := fwd.Stats()
	fmt.Printf("all %d events read from Kafka, in order per customer, each on the Kafka partition of its outbox partition (forwarded in %d batches)\n", len(seen), st.Batches)
	return nil
}

// placeOrder stores an order and publishes OrderPlaced in one transaction:
// the event exists if and only if the order does.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, pub *outbox.Publisher, id int, customer string, totalCents int64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // no-op after Commit
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, total_cents) VALUES ($1, $2, $3)`, id, customer, totalCents); err != nil {
		return err
	}
	payload, _ := json.Marshal(map[string]any{"order_id": id, "customer": customer, "total_cents": totalCents})
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, customer) // per-customer order
	msg.SetContext(outbox.WithTx(ctx, tx))
	if err := pub.Publish("orders", msg); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
