// Command inbox shows exactly-once effects downstream of a broker: payments
// are published through the outbox, forwarded to Kafka (in-process broker)
// twice over by at-least-once forwarders (as copies arrive from any
// at-least-once path: a PublisherTarget, a NATS stream past its duplicate
// window, a consumer that crashed before committing its offset), and a
// Watermill Router reading Kafka books them in a ledger through the inbox
// middleware: every payment is booked once, whatever the copies. (The
// Kafka forwarder is exactly once by default; here it is turned off to
// make the copies.)
//
//	go run ./_examples/inbox
//
// No setup: PostgreSQL is a throwaway server. The last line printed is OK.
package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/inbox"
)

const (
	partitions = 4
	payments   = 200
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
	if err := outbox.RegisterTopic(ctx, db.Pool, outbox.DefaultSchema, "payments", partitions); err != nil {
		return err
	}
	// The consumer's side (here in the same database): the ledger and the
	// inbox's marks.
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE ledger (id serial PRIMARY KEY, customer text NOT NULL, cents bigint NOT NULL)`); err != nil {
		return err
	}
	if err := inbox.Migrate(ctx, db.Pool, inbox.DefaultSchema); err != nil {
		return err
	}

	// Publish the payments through the outbox.
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: db.Pool, OwnTransaction: true}, logger)
	if err != nil {
		return err
	}
	var want int64
	for i := 1; i <= payments; i++ {
		m := message.NewMessage(fmt.Sprintf("payment-%d", i), []byte(strconv.Itoa(i*10)))
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, fmt.Sprintf("customer-%d", i%17))
		if err := pub.Publish("payments", m); err != nil {
			return err
		}
		want += int64(i * 10)
	}

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "payments"))
	if err != nil {
		return err
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	// Forward everything, then forward everything again from another
	// consumer group: Kafka now holds each payment twice, with the same
	// outbox position (as after a forwarder takeover that resends a batch).
	for _, group := range []string{"forwarder-a", "forwarder-b"} {
		if err := forwardAll(ctx, brokers, db, group, logger); err != nil {
			return err
		}
	}
	fmt.Printf("Kafka topic payments holds %d records for %d payments\n", 2*payments, payments)

	// The consumer: a Router reading Kafka, the handler booking in the
	// ledger, the inbox middleware making it exactly once.
	in, err := inbox.New(inbox.Config{Pool: db.Pool, Consumer: "ledger"})
	if err != nil {
		return err
	}
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{Brokers: brokers, Unmarshaler: wmkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc, ConsumerGroup: "ledger"}, logger)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(in.Middleware) // the one line that makes the handlers exactly once
	router.AddConsumerHandler("ledger", "payments", sub, func(msg *message.Message) error {
		tx, _ := outbox.TxFromContext[pgx.Tx](msg.Context())
		cents, err := strconv.ParseInt(string(msg.Payload), 10, 64)
		if err != nil {
			return err
		}
		_, err = tx.Exec(msg.Context(), `INSERT INTO ledger (customer, cents) VALUES ($1, $2)`, msg.Metadata.Get(outbox.PublishPartitionKeyMetadata), cents)
		return err
	})
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	defer func() { _ = router.Close(); <-routerDone }()

	for in.Stats().Processed+in.Stats().Duplicates < 2*payments {
		select {
		case <-ctx.Done():
			return fmt.Errorf("consumed %+v of %d records", in.Stats(), 2*payments)
		case <-time.After(50 * time.Millisecond):
		}
	}
	var booked, sum int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(cents), 0) FROM ledger`).Scan(&booked, &sum); err != nil {
		return err
	}
	fmt.Printf("inbox: %d processed, %d duplicates dropped; ledger: %d bookings, %d cents (want %d, %d)\n",
		in.Stats().Processed, in.Stats().Duplicates, booked, sum, payments, want)
	if booked != payments || sum != want {
		return fmt.Errorf("the ledger booked %d payments for %d cents, want %d for %d", booked, sum, payments, want)
	}
	return nil
}

// forwardAll forwards every payment to Kafka as consumer group group, and
// stops.
func forwardAll(ctx context.Context, brokers []string, db *exampledb.DB, group string, logger watermill.LoggerAdapter) error {
	// AtLeastOnce: two forwarder groups of one outbox into one Kafka
	// topic would otherwise recognise each other's records and skip them.
	target, err := kafka.NewTarget(kafka.Config{Brokers: brokers, AtLeastOnce: true}, logger)
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
		Subscriber: outbox.SubscriberConfig{Pool: db.Pool, ConsumerGroup: group, RejectHandler: deadLetters},
		Topics:     []string{"payments"},
		Target:     target,
	}, logger)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	for fwd.Stats().Messages < payments {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	_ = fwd.Close()
	return <-done
}
