// Command settings-tombstones shows tombstones and CloudEvents: users'
// settings are rows written with an event each, in one transaction; a
// deleted setting publishes a tombstone (outbox.Tombstone). One forwarder
// relays the events to a compacted Kafka topic as CloudEvents (binary
// mode), another to a NATS KV bucket with per-key subjects. After Kafka
// compacts the topic and in the bucket, the deleted setting is gone.
//
//	go run ./_examples/settings-tombstones
//
// No setup: PostgreSQL is a throwaway server, Kafka an in-process fake
// cluster (franz-go's kfake), NATS an embedded server. The last line
// printed is OK.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
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
	if err := outbox.RegisterTopic(ctx, db.Pool, outbox.DefaultSchema, "settings", 1); err != nil {
		return err
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE settings (key text PRIMARY KEY, value text NOT NULL)`); err != nil {
		return err
	}

	// Kafka: a compacted topic that drops tombstones as soon as it compacts.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return err
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := kadm.NewClient(admin).CreateTopic(ctx, 1, 1, map[string]*string{
		"cleanup.policy": kadm.StringPtr("compact"), "delete.retention.ms": kadm.StringPtr("0"),
	}, "shop.settings"); err != nil {
		return err
	}
	toKafka, err := kafka.NewTarget(kafka.Config{Brokers: brokers, CloudEvents: forwarder.CloudEvents{
		Mode: forwarder.CloudEventsBinary, Source: "/shop/settings", DataContentType: "text/plain",
	}}, logger)
	if err != nil {
		return err
	}
	defer toKafka.Close()

	// NATS: a KV bucket; each key is a subject of its own ("$KV.settings.<key>").
	store, err := os.MkdirTemp("", "outbox-nats-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(store)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: store, NoLog: true, NoSigs: true})
	if err != nil {
		return err
	}
	go ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("nats-server not ready")
	}
	toNATS, err := jetstream.NewTarget(jetstream.Config{URL: ns.ClientURL(), KeySubjects: true}, logger)
	if err != nil {
		return err
	}
	defer toNATS.Close()
	kv, err := toNATS.JetStream().CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: "settings"})
	if err != nil {
		return err
	}

	// Two forwarders, each a consumer group of the outbox topic.
	for group, target := range map[string]forwarder.Target{"to-kafka": toKafka, "to-nats": toNATS} {
		mapping := map[string]string{"to-kafka": "shop.settings", "to-nats": "$KV.settings"}[group]
		fwd, err := forwarder.NewForwarder(forwarder.Config{
			Subscriber:  outbox.SubscriberConfig{Pool: db.Pool, ConsumerGroup: group},
			Topics:      []string{"settings"},
			Target:      target,
			TargetTopic: func(string) string { return mapping },
		}, logger)
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() { done <- fwd.Run(ctx) }()
		defer func() { _ = fwd.Close(); <-done }()
	}

	pub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: db.Pool}, logger)
	if err != nil {
		return err
	}
	for _, s := range [][2]string{{"user-1.theme", "dark"}, {"user-2.theme", "light"}, {"user-2.lang", "fr"}, {"user-3.theme", "dark"}} {
		if err := setSetting(ctx, db.Pool, pub, s[0], s[1]); err != nil {
			return err
		}
	}
	if err := deleteSetting(ctx, db.Pool, pub, "user-2.theme"); err != nil {
		return err
	}
	fmt.Println("set 4 settings, deleted user-2.theme")

	// Kafka: five records, the last one the tombstone: the key, a null
	// value, the CloudEvents attributes as headers.
	var records []*kgo.Record
	for len(records) < 5 {
		if records, err = readTopic(ctx, brokers, "shop.settings"); err != nil {
			return err
		}
	}
	tomb := records[4]
	fmt.Printf("Kafka tombstone: key %s, value null %v, ce_type %s, ce_id %s\n", tomb.Key, tomb.Value == nil, header(tomb, "ce_type"), header(tomb, "ce_id"))
	if tomb.Value != nil || string(tomb.Key) != "user-2.theme" {
		return fmt.Errorf("the tombstone record: key %q, value %q", tomb.Key, tomb.Value)
	}
	// One more record, so that the tombstone is not in the last record
	// batch (which Kafka never compacts: the active segment).
	if err := setSetting(ctx, db.Pool, pub, "user-4.theme", "dark"); err != nil {
		return err
	}
	for len(records) < 6 {
		if records, err = readTopic(ctx, brokers, "shop.settings"); err != nil {
			return err
		}
	}
	cluster.Compact()
	if records, err = readTopic(ctx, brokers, "shop.settings"); err != nil {
		return err
	}
	var keys []string
	for _, r := range records {
		keys = append(keys, string(r.Key))
	}
	fmt.Printf("Kafka after compaction: %s\n", strings.Join(keys, ", "))
	if slices.Contains(keys, "user-2.theme") {
		return errors.New("user-2.theme is still on Kafka after compaction")
	}

	// NATS: the bucket has no user-2.theme any more.
	for {
		_, err := kv.Get(ctx, "user-2.theme")
		if errors.Is(err, natsjs.ErrKeyNotFound) {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("user-2.theme still in the KV bucket: %w", ctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	lang, err := kv.Get(ctx, "user-2.lang")
	if err != nil {
		return err
	}
	fmt.Printf("NATS KV: user-2.theme deleted, user-2.lang = %s\n", lang.Value())
	return nil
}

// setSetting stores a setting and publishes its new value in one
// transaction; metadata ce_type is the CloudEvents type.
func setSetting(ctx context.Context, pool *pgxpool.Pool, pub *outbox.Publisher, key, value string) error {
	return inTx(ctx, pool, func(tx context.Context, exec func(string, ...any) error) error {
		if err := exec(`INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = $2`, key, value); err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewUUID(), []byte(value))
		msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
		msg.Metadata.Set("ce_type", "com.shop.setting.changed")
		msg.SetContext(tx)
		return pub.Publish("settings", msg)
	})
}

// deleteSetting deletes a setting and publishes a tombstone of its key in
// one transaction.
func deleteSetting(ctx context.Context, pool *pgxpool.Pool, pub *outbox.Publisher, key string) error {
	return inTx(ctx, pool, func(tx context.Context, exec func(string, ...any) error) error {
		if err := exec(`DELETE FROM settings WHERE key = $1`, key); err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
		msg.Metadata.Set("ce_type", "com.shop.setting.deleted")
		if err := outbox.Tombstone(msg); err != nil {
			return err
		}
		msg.SetContext(tx)
		return pub.Publish("settings", msg)
	})
}

// inTx runs fn in a transaction: fn gets a context carrying it (for the
// outbox) and a function that executes SQL in it.
func inTx(ctx context.Context, pool *pgxpool.Pool, fn func(tx context.Context, exec func(string, ...any) error) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // no-op after Commit
	exec := func(sql string, args ...any) error { _, err := tx.Exec(ctx, sql, args...); return err }
	if err := fn(outbox.WithTx(ctx, tx), exec); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// readTopic returns the committed records of partition 0 of topic, read
// until a poll brings nothing for half a second.
func readTopic(ctx context.Context, brokers []string, topic string) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	for {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fetches := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		n := 0
		fetches.EachRecord(func(r *kgo.Record) { out = append(out, r); n++ })
		if n == 0 {
			return out, nil
		}
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
