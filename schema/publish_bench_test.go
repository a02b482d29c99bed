package schema_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/schema"
)

// perTx is the messages of one transaction in BenchmarkPublish100PerTx.
const perTx = 100

// BenchmarkPublish100PerTx publishes transactions of 100 orders of ~1 KB
// into a real PostgreSQL (a durable throwaway cluster: fsync and
// synchronous_commit on; or the server of OUTBOX_TEST_DATABASE_URL), one
// transaction per op, one after the other:
//
//   - plain: the outbox Publisher, the Avro records' bytes as payloads;
//   - validated: the same messages through the Codec's Publisher (Avro
//     schema): each record validated and put in the wire format, in the
//     transaction;
//   - encoded: the orders as Go values, encoded by Codec.NewMessage, then
//     through the Codec's Publisher.
//
// msgs/s of validated over plain is the throughput kept with validation
// (issue 43's target: at least 0.7). Run with
//
//	go test ./schema -run '^$' -bench Publish100PerTx -benchtime 300x -count 3
func BenchmarkPublish100PerTx(b *testing.B) {
	dbURL := startPostgres(b)
	orders := make([]Order, perTx)
	records := make([][]byte, perTx)
	for i := range orders {
		orders[i] = benchOrder(i)
		records[i] = avroRecord(b, orders[i])
	}
	checkSize(b, "Avro", records[0])

	b.Run("plain", func(b *testing.B) {
		db := newOutbox(b, dbURL, "orders")
		pub := db.publisher(b)
		benchPublish(b, db, func() error {
			return pub.Publish("orders", bareMessages(records)...)
		}, false)
	})
	b.Run("validated", func(b *testing.B) {
		codec, topic := newCodec(b, schema.Avro, orderAvro)
		db := newOutbox(b, dbURL, topic)
		pub, err := codec.Publisher(db.publisher(b))
		if err != nil {
			b.Fatal(err)
		}
		benchPublish(b, db, func() error {
			return pub.Publish(topic, bareMessages(records)...)
		}, true)
	})
	b.Run("encoded", func(b *testing.B) {
		codec, topic := newCodec(b, schema.Avro, orderAvro)
		db := newOutbox(b, dbURL, topic)
		pub, err := codec.Publisher(db.publisher(b))
		if err != nil {
			b.Fatal(err)
		}
		benchPublish(b, db, func() error {
			msgs := make([]*message.Message, len(orders))
			for i := range orders {
				m, err := codec.NewMessage(topic, orders[i])
				if err != nil {
					return err
				}
				m.Metadata.Set(outbox.PublishPartitionKeyMetadata, orders[i].Customer)
				msgs[i] = m
			}
			return pub.Publish(topic, msgs...)
		}, true)
	})
}

// bareMessages makes a transaction's messages of the records, as an
// application would: a new UUID each, the customer as partition key.
func bareMessages(records [][]byte) []*message.Message {
	msgs := make([]*message.Message, len(records))
	for i, r := range records {
		m := message.NewMessage(watermill.NewUUID(), r)
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "customer-"+strconv.Itoa(i%1000))
		msgs[i] = m
	}
	return msgs
}

// benchPublish runs b.N transactions, each BEGIN, publish (with the
// messages bound to the transaction through outbox.WithTx), COMMIT, and
// reports msgs/s. Then it checks that every message was written, in the
// wire format when wire is set, and as given otherwise.
func benchPublish(b *testing.B, db *benchOutbox, publish func() error, wire bool) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			db.tx = outbox.WithTx(ctx, tx)
			return publish()
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	msgs := b.N * perTx
	b.ReportMetric(float64(msgs)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(elapsed.Microseconds())/float64(msgs), "µs/msg")

	var rows, inWire int
	err := db.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE get_byte(coalesce(p.payload, d.payload), 0) = 0)
		FROM %[1]s.pending p LEFT JOIN %[1]s.bodies d ON d.id = p.body_id`, pgx.Identifier{db.schema}.Sanitize())).Scan(&rows, &inWire)
	if err != nil {
		b.Fatal(err)
	}
	want := 0
	if wire {
		want = msgs
	}
	if rows != msgs || inWire != want {
		b.Fatalf("%d rows written, %d in the wire format; want %d and %d", rows, inWire, msgs, want)
	}
}

// benchOutbox is an outbox in a schema of its own, with one topic of 16
// partitions.
type benchOutbox struct {
	pool   *pgxpool.Pool
	schema string
	tx     context.Context // the current transaction's, for the messages
}

func newOutbox(b *testing.B, dbURL, topic string) *benchOutbox {
	b.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	name := make([]byte, 5)
	_, _ = rand.Read(name)
	db := &benchOutbox{pool: pool, schema: "schema_bench_" + hex.EncodeToString(name)}
	b.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{db.schema}.Sanitize()+" CASCADE")
	})
	if err := outbox.Migrate(ctx, pool, db.schema); err != nil {
		b.Fatal(err)
	}
	if err := outbox.RegisterTopic(ctx, pool, db.schema, topic, 16); err != nil {
		b.Fatal(err)
	}
	return db
}

// publisher returns an outbox Publisher whose messages are written in the
// transaction benchPublish began: it binds each message to it.
func (db *benchOutbox) publisher(b *testing.B) message.Publisher {
	b.Helper()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: db.schema}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return txBinder{db: db, next: pub}
}

// txBinder binds the messages to the current transaction, as an
// application's code does with msg.SetContext(outbox.WithTx(ctx, tx)).
type txBinder struct {
	db   *benchOutbox
	next message.Publisher
}

func (p txBinder) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		m.SetContext(p.db.tx)
	}
	return p.next.Publish(topic, msgs...)
}

func (p txBinder) Close() error { return p.next.Close() }

// startPostgres returns the URL of OUTBOX_TEST_DATABASE_URL, or starts a
// durable throwaway cluster, stopped with b (once per run of the
// benchmark: the package has no TestMain, so that its tests do not start
// a server they do not need).
func startPostgres(b *testing.B) string {
	b.Helper()
	if url := os.Getenv(pgtest.EnvDatabaseURL); url != "" {
		return url
	}
	cluster, err := pgtest.StartCluster(context.Background(), pgcluster.Options{Durable: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cluster.Stop)
	return cluster.URL("postgres")
}
