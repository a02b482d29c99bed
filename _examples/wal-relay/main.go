// Command wal-relay shows the log-based mode: orders are written with their
// OrderPlaced events in one transaction each, the events going into the
// WAL only (outbox.ModeWAL: pg_logical_emit_message, nothing in a table); a
// relay reads them from the schema's logical replication slot, numbers
// them and appends them to the outbox log, and a Forwarder sends them to
// Kafka, where a watermill-kafka subscriber reads them in order per
// customer. A rolled-back order's event never appears.
//
//	go run ./_examples/wal-relay
//
// No setup: PostgreSQL is a throwaway server started with wal_level =
// logical, Kafka an in-process fake cluster (franz-go's kfake). The last
// line printed is OK.
package main

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/millrace/watermill-outbox/relay"
)

const (
	partitions = 4
	customers  = 10
	orders     = 300
)

func main() { exampledb.Main(run) }

func run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	db, err := exampledb.StartLogical(ctx)
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
	// The slot and its publication, once (like Migrate; it does nothing
	// that exists). From now on PostgreSQL keeps the WAL a relay has not
	// read: run a relay, and DropSlot when the mode is no longer used.
	if err := relay.CreateSlot(ctx, db.Pool, outbox.DefaultSchema); err != nil {
		return err
	}
	defer func() { _ = relay.DropSlot(context.Background(), db.Pool, outbox.DefaultSchema, false) }()

	// Place the orders before any relay runs: the events wait in the WAL.
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: db.Pool, Mode: outbox.ModeWAL}, logger)
	if err != nil {
		return err
	}
	for id := 1; id <= orders; id++ {
		if err := placeOrder(ctx, db.Pool, pub, id, "customer-"+strconv.Itoa(id%customers), int64(id*100), id == 7); err != nil {
			return err
		}
	}
	st, err := relay.StatusOf(ctx, db.Pool, outbox.DefaultSchema)
	if err != nil {
		return err
	}
	fmt.Printf("placed %d orders (order 7 rolled back); slot %s keeps %d bytes of WAL, no relay yet\n", orders, st.Slot, st.RetainedWALBytes)

	// The relay: one streams the slot; more would wait as standbys.
	rel, err := relay.New(relay.Config{Pool: db.Pool}, logger)
	if err != nil {
		return err
	}
	relDone := make(chan error, 1)
	go func() { relDone <- rel.Run(ctx) }()
	defer func() { _ = rel.Close(); <-relDone }()

	// Kafka, and the forwarder of the outbox topic "orders" to "shop.orders".
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "shop.orders"))
	if err != nil {
		return err
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	target, err := kafka.NewTarget(kafka.Config{Brokers: brokers}, logger)
	if err != nil {
		return err
	}
	defer target.Close()
	// A record Kafka refuses for good goes to the dead-letter store.
	deadLetters, err := deadletter.NewStore(deadletter.Config{Pool: db.Pool}, logger)
	if err != nil {
		return err
	}
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		// The relay appends to the log; no table-mode Sequencer is needed.
		Subscriber:  outbox.SubscriberConfig{Pool: db.Pool, DisableSequencer: true, RejectHandler: deadLetters},
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

	// A Watermill application reading the Kafka topic (read_committed: the
	// forwarder writes in Kafka transactions).
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
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
	last := map[string]int{}
	for got := 0; got < orders-1; got++ {
		var m *message.Message
		select {
		case m = <-msgs:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d events arrived: %w", got, orders-1, ctx.Err())
		}
		m.Ack()
		var ev struct {
			OrderID  int    `json:"order_id"`
			Customer string `json:"customer"`
		}
		if err := json.Unmarshal(m.Payload, &ev); err != nil {
			return err
		}
		if ev.OrderID == 7 {
			return errors.New("the rolled-back order 7 reached Kafka")
		}
		if ev.OrderID <= last[ev.Customer] {
			return fmt.Errorf("%s: order %d arrived after order %d", ev.Customer, ev.OrderID, last[ev.Customer])
		}
		last[ev.Customer] = ev.OrderID
	}
	if st, err = rel.Status(ctx); err != nil {
		return err
	}
	fmt.Printf("all %d events in Kafka, in order per customer; the relay appended %d; slot active %v\n", orders-1, rel.Stats().Appended, st.Active)
	return nil
}

// placeOrder stores an order and publishes OrderPlaced in one transaction,
// or rolls both back.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, pub *outbox.Publisher, id int, customer string, totalCents int64, rollback bool) error {
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
	msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, customer)
	msg.SetContext(outbox.WithTx(ctx, tx))
	if err := pub.Publish("orders", msg); err != nil {
		return err
	}
	if rollback {
		return tx.Rollback(ctx)
	}
	return tx.Commit(ctx)
}
