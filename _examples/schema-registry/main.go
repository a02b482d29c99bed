// Command schema-registry shows events with a schema: orders are written
// with their OrderPlaced events in one transaction each, the events Avro
// records validated and encoded by package schema before the outbox
// Publisher writes them. An event that does not match the schema is
// refused inside the transaction, so its order is not committed either.
// A forwarder relays the events to Kafka unchanged, in the Confluent wire
// format, and a plain Kafka consumer reads them with franz-go's sr.Serde,
// as any consumer of a schema'd topic would.
//
//	go run ./_examples/schema-registry
//	SCHEMA_REGISTRY_URL=http://localhost:8081 go run ./_examples/schema-registry
//
// No setup: PostgreSQL is a throwaway server, Kafka an in-process fake
// cluster (franz-go's kfake), and the schema registry an in-process
// stand-in (package schema/schematest: the REST subset franz-go's sr
// client uses, compatibility checks included) unless SCHEMA_REGISTRY_URL
// names a real one (Confluent, Karapace, Redpanda, Apicurio in ccompat
// mode), where the schema is registered under the subject
// "shop.orders-value" (the TopicName strategy of the outbox topic
// "shop.orders"). The last line printed is OK.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/schema"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

const (
	topic      = "shop.orders" // the outbox topic, forwarded to the Kafka topic of the same name
	partitions = 4
	orders     = 40
)

// orderPlacedSchema is the schema of the topic's values (an .avsc file,
// in an application).
const orderPlacedSchema = `{
  "type": "record", "name": "OrderPlaced", "namespace": "shop",
  "fields": [
    {"name": "order_id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "total_cents", "type": "long"},
    {"name": "currency", "type": "string", "default": "EUR"}
  ]
}`

// OrderPlaced is the event; hamba/avro encodes it by its avro tags.
type OrderPlaced struct {
	OrderID    int64  `avro:"order_id"`
	Customer   string `avro:"customer"`
	TotalCents int64  `avro:"total_cents"`
	Currency   string `avro:"currency"`
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
	if err := outbox.RegisterTopic(ctx, db.Pool, outbox.DefaultSchema, topic, partitions); err != nil {
		return err
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL)`); err != nil {
		return err
	}

	// The schema registry: SCHEMA_REGISTRY_URL's, or an in-process one.
	registryURL := os.Getenv("SCHEMA_REGISTRY_URL")
	if registryURL == "" {
		standIn := schematest.NewStandIn()
		if registryURL, err = standIn.Start(); err != nil {
			return err
		}
		defer standIn.Close()
		fmt.Printf("Schema registry: in-process stand-in on %s (set SCHEMA_REGISTRY_URL to use a real one)\n", registryURL)
	} else {
		fmt.Printf("Schema registry: %s\n", registryURL)
	}
	registry, err := sr.NewClient(sr.URLs(registryURL))
	if err != nil {
		return err
	}

	// The Codec registers the topic's schema at start (a schema the
	// registry refuses stops the service here, not at its first event),
	// and its Publisher validates and encodes every event of the topic
	// before the outbox Publisher writes it.
	codec, err := schema.New(ctx, schema.Config{
		Client:  registry,
		Schemas: []schema.TopicSchema{{Topic: topic, Format: schema.Avro, Text: orderPlacedSchema}},
	}, logger)
	if err != nil {
		return err
	}
	outboxPub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: db.Pool}, logger)
	if err != nil {
		return err
	}
	pub, err := codec.Publisher(outboxPub)
	if err != nil {
		return err
	}

	var schemaID string
	for id := int64(1); id <= orders; id++ {
		ev := OrderPlaced{OrderID: id, Customer: "customer-" + strconv.Itoa(int(id%7)), TotalCents: id * 250, Currency: "EUR"}
		if schemaID, err = placeOrder(ctx, db.Pool, pub, codec, ev); err != nil {
			return err
		}
	}
	fmt.Printf("placed %d orders, each with an OrderPlaced event in the wire format (schema id %s)\n", orders, schemaID)

	// An old code path still publishes JSON: refused, and its order is
	// not committed.
	err = placeLegacyOrder(ctx, db.Pool, pub, 999)
	var serr *schema.SchemaError
	if !errors.As(err, &serr) || !errors.Is(err, schema.ErrMismatch) {
		return fmt.Errorf("the malformed event was not refused with a *schema.SchemaError: %v", err)
	}
	fmt.Printf("refused: %v\n", err)
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id = 999`).Scan(&n); err != nil {
		return err
	}
	if n != 0 {
		return errors.New("order 999 was committed without its event")
	}
	fmt.Printf("order 999 not committed (topic %s, subject %s, version %d)\n", serr.Topic, serr.Subject, serr.Version)

	// Kafka, and a forwarder relaying the events as they are stored.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
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
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Pool: db.Pool},
		Topics:     []string{topic},
		Target:     target,
	}, logger)
	if err != nil {
		return err
	}
	fwdDone := make(chan error, 1)
	go func() { fwdDone <- fwd.Run(ctx) }()
	defer func() { _ = fwd.Close(); <-fwdDone }()

	return consume(ctx, brokers, registry)
}

// placeOrder stores an order and publishes its OrderPlaced event in one
// transaction. NewMessage encodes the event with the topic's schema; a
// value that does not fit it is a *schema.SchemaError, before anything is
// written. It returns the event's schema id.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, pub *schema.Publisher, codec *schema.Codec, ev OrderPlaced) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx) // no-op after Commit
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, total_cents) VALUES ($1, $2, $3)`, ev.OrderID, ev.Customer, ev.TotalCents); err != nil {
		return "", err
	}
	msg, err := codec.NewMessage(topic, ev)
	if err != nil {
		return "", err
	}
	msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, ev.Customer) // per-customer order
	msg.SetContext(outbox.WithTx(ctx, tx))
	if err := pub.Publish(topic, msg); err != nil {
		return "", err
	}
	return msg.Metadata.Get(schema.MetadataSchemaID), tx.Commit(ctx)
}

// placeLegacyOrder is placeOrder as an old code path wrote it: the event is
// JSON, not the schema's Avro. The Publisher refuses it, the transaction
// is rolled back, and the order is not stored.
func placeLegacyOrder(ctx context.Context, pool *pgxpool.Pool, pub *schema.Publisher, id int64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, total_cents) VALUES ($1, 'customer-legacy', 100)`, id); err != nil {
		return err
	}
	msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order_id": %d, "customer": "customer-legacy"}`, id))
	msg.SetContext(outbox.WithTx(ctx, tx))
	if err := pub.Publish(topic, msg); err != nil {
		return err // the deferred Rollback undoes the INSERT
	}
	return tx.Commit(ctx)
}

// consume reads the Kafka topic as a consumer of any other service would:
// kgo, and sr.Serde decoding each record by the schema id in its header
// (the schema fetched from the registry once per id).
func consume(ctx context.Context, brokers []string, registry *sr.Client) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return err
	}
	defer cl.Close()
	var serde sr.Serde
	known := map[int]bool{} // schema ids registered with serde
	seen := map[int64]bool{}
	var first OrderPlaced
	for len(seen) < orders {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("%d of %d events read from Kafka: %w", len(seen), orders, ctx.Err())
		}
		if err := fetches.Err(); err != nil {
			return err
		}
		for _, r := range fetches.Records() {
			if err := knowSchema(ctx, &serde, known, registry, r.Value); err != nil {
				return err
			}
			var ev OrderPlaced
			if err := serde.Decode(r.Value, &ev); err != nil {
				return fmt.Errorf("record at %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
			}
			if string(r.Key) != ev.Customer {
				return fmt.Errorf("order %d: Kafka key %q, customer %q", ev.OrderID, r.Key, ev.Customer)
			}
			if len(seen) == 0 {
				first = ev
			}
			seen[ev.OrderID] = true // a redelivered copy (at-least-once) counts once
		}
	}
	if seen[999] {
		return errors.New("the refused event reached Kafka")
	}
	fmt.Printf("read %d events from Kafka with sr.Serde, e.g. %+v\n", len(seen), first)
	return nil
}

// knowSchema registers the schema of the record's id with serde, fetched
// from the registry, the first time the id is seen.
func knowSchema(ctx context.Context, serde *sr.Serde, known map[int]bool, registry *sr.Client, value []byte) error {
	id, _, err := (&sr.ConfluentHeader{}).DecodeID(value)
	if err != nil {
		return fmt.Errorf("a record not in the wire format: %w", err)
	}
	if known[id] {
		return nil
	}
	s, err := registry.SchemaByID(ctx, id)
	if err != nil {
		return err
	}
	avsc, err := avro.Parse(s.Schema)
	if err != nil {
		return err
	}
	serde.Register(id, OrderPlaced{},
		sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(avsc, v) }),
		sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(avsc, b, v) }))
	known[id] = true
	return nil
}
