package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/ceiling"
	"github.com/millrace/watermill-outbox/internal/names"
)

// A publish variant writes one transaction's messages.
type publishVariant struct {
	name string
	// setup prepares a fresh schema for the variant.
	setup func(ctx context.Context, e *env, schema string) (*publishTarget, error)
}

// publishTarget is a variant set up in a schema.
type publishTarget struct {
	publish  func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error
	countSQL string       // counts the rows written
	notified func() int64 // notifications received so far; nil without a listener
	stop     func()       // releases what setup started; may be nil
}

// publishVariants, plain first: the others report their ratio to it.
// plain-pending sits between plain and the outbox: the plain INSERT into the
// outbox's own pending table (identity column and index), which separates
// what the table costs from what the Publisher adds.
var publishVariants = []publishVariant{
	{name: "plain", setup: setupPlain},
	{name: "plain-pending", setup: setupPlainPending},
	{name: "outbox-nonotify", setup: func(ctx context.Context, e *env, schema string) (*publishTarget, error) {
		return setupOutbox(ctx, e, schema, true)
	}},
	{name: "outbox-notify", setup: func(ctx context.Context, e *env, schema string) (*publishTarget, error) {
		return setupOutbox(ctx, e, schema, false)
	}},
}

// setupPlain creates the ceiling: a bare table with the same columns as the
// outbox's pending table, no identity and no index, written with one
// multi-row INSERT per transaction. The messages are turned into rows the
// way an application would (partition by the same murmur2 partitioner,
// metadata as JSON), so both sides do comparable client-side work.
func setupPlain(ctx context.Context, e *env, schema string) (*publishTarget, error) {
	if err := e.ddl(ctx, schema, `CREATE TABLE {{s}}.plain (
		uuid          text        NOT NULL,
		metadata      jsonb       NOT NULL,
		payload       bytea       NOT NULL,
		partition_key text,
		topic         text        NOT NULL,
		partition     integer     NOT NULL,
		created_at    timestamptz NOT NULL DEFAULT now()
	) WITH (autovacuum_enabled = false)`); err != nil {
		return nil, err
	}
	insert := sqlFor(schema, "INSERT INTO {{s}}.plain "+ceiling.InsertColumns)
	return &publishTarget{publish: ceiling.PlainInsert(insert, topic, partitionCount), countSQL: sqlFor(schema, "SELECT count(*) FROM {{s}}.plain")}, nil
}

// setupPlainPending writes the plain way (same statement shape and client
// work as plain) into the outbox's pending table, created by Migrate.
func setupPlainPending(ctx context.Context, e *env, schema string) (*publishTarget, error) {
	if _, err := setupOutbox(ctx, e, schema, true); err != nil {
		return nil, err
	}
	insert := sqlFor(schema, "INSERT INTO {{s}}.pending "+ceiling.InsertColumns)
	return &publishTarget{publish: ceiling.PlainInsert(insert, topic, partitionCount), countSQL: sqlFor(schema, "SELECT count(*) FROM {{s}}.pending")}, nil
}

// setupOutbox migrates the outbox into schema, registers the topic and
// returns a long-lived context-bound Publisher (the recommended use: one
// instance, each message carrying its transaction via outbox.WithTx). With
// NOTIFY on, a connection LISTENs on the publisher's channel meanwhile, as
// the sequencer does, so that the notifications are delivered, not just
// queued.
func setupOutbox(ctx context.Context, e *env, schema string, disableNotify bool) (*publishTarget, error) {
	if err := outbox.Migrate(ctx, e.pool, schema); err != nil {
		return nil, err
	}
	if err := outbox.RegisterTopic(ctx, e.pool, schema, topic, partitionCount); err != nil {
		return nil, err
	}
	// Like the plain table and the raw layouts: no autovacuum during the
	// measurements, so that the WAL and CPU figures are the statements' own.
	if err := e.ddl(ctx, schema, `ALTER TABLE {{s}}.pending SET (autovacuum_enabled = false, toast.autovacuum_enabled = false);
		ALTER TABLE {{s}}.log SET (autovacuum_enabled = false, toast.autovacuum_enabled = false);
		ALTER TABLE {{s}}.partitions SET (autovacuum_enabled = false)`); err != nil {
		return nil, err
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DisableNotify: disableNotify}, nil)
	if err != nil {
		return nil, err
	}
	t := &publishTarget{
		publish: func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
			txCtx := outbox.WithTx(ctx, tx)
			for _, m := range msgs {
				m.SetContext(txCtx)
			}
			return pub.Publish(topic, msgs...)
		},
		countSQL: sqlFor(schema, "SELECT count(*) FROM {{s}}.pending"),
	}
	if !disableNotify {
		if t.notified, t.stop, err = listen(ctx, names.PendingChannel(schema)); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// listen holds a connection LISTENing on channel and counts the
// notifications it receives until stop is called.
func listen(ctx context.Context, channel string) (received func() int64, stop func(), err error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		_ = conn.Close(ctx)
		return nil, nil, err
	}
	var n atomic.Int64
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	stop = func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	}
	return n.Load, stop, nil
}

// messages builds n messages as an application would: fresh UUID, a key
// in the metadata, the payload.
func (g *gen) messages(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		m := message.NewMessage(watermill.NewUUID(), g.payload)
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, keys[g.key()])
		msgs[i] = m
	}
	return msgs
}

// runPublish sets up v in a fresh schema, publishes n messages in
// transactions of perTx from the worker goroutines (timed), checks the row
// count when check is set, and drops the schema.
func runPublish(ctx context.Context, e *env, t timer, v publishVariant, perTx, n int, check bool) (phase, error) {
	schema, err := e.newSchema(ctx, "pub")
	if err != nil {
		return phase{}, err
	}
	defer func() { _ = e.dropSchema(context.WithoutCancel(ctx), schema) }()
	target, err := v.setup(ctx, e, schema)
	if err != nil {
		return phase{}, err
	}
	if target.stop != nil {
		defer target.stop()
	}
	if err := e.maybeCheckpoint(ctx); err != nil {
		return phase{}, err
	}
	ph, err := e.measure(ctx, t, n, func() error {
		return e.publishConcurrently(ctx, n, perTx, payloadSize, func(ctx context.Context, tx pgx.Tx, g *gen, k int) error {
			return target.publish(ctx, tx, g.messages(k))
		})
	})
	if err != nil {
		return phase{}, fmt.Errorf("%s: %w", v.name, err)
	}
	if !check {
		return ph, nil
	}
	got, err := e.count(ctx, target.countSQL)
	if err != nil {
		return phase{}, err
	}
	if got != n {
		return phase{}, fmt.Errorf("%s: %d rows written, want %d", v.name, got, n)
	}
	if target.notified != nil {
		// Notifications arrive asynchronously; one per transaction at most
		// (identical ones of a transaction are folded into one).
		deadline := time.Now().Add(5 * time.Second)
		for target.notified() == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := target.notified(); got == 0 || got > int64((n+perTx-1)/perTx) {
			return phase{}, fmt.Errorf("%s: listener got %d notifications for %d transactions", v.name, got, (n+perTx-1)/perTx)
		}
	}
	return ph, nil
}

// BenchmarkPublish compares, at 1 and 100 messages per transaction, the
// outbox Publisher (with and without its NOTIFY) to a plain multi-row INSERT
// of the same rows into a bare table: the ceiling. One op is one message;
// each transaction is BEGIN, one publish call, COMMIT, from 4 goroutines
// with a connection each.
func BenchmarkPublish(b *testing.B) {
	e := newEnv(b, true)
	for _, perTx := range []int{1, 100} {
		b.Run(fmt.Sprintf("perTx=%d", perTx), func(b *testing.B) {
			var names []string
			for r := 0; r < *rounds; r++ {
				for _, v := range publishVariants {
					b.Run(v.name, func(b *testing.B) { benchPublish(b, e, v, perTx) })
					if r == 0 {
						names = append(names, v.name)
					}
				}
			}
			printMedians(b.Name(), names, []string{"msgs/s", "WAL-B/msg", "cpu-us/msg"})
			for _, metric := range []string{"msgs/s", "cpu-us/msg"} {
				get := func(v string) (float64, bool) { return lookup(b.Name()+"/"+v, metric) }
				plain, okP := get("plain")
				table, okT := get("plain-pending")
				quiet, okQ := get("outbox-nonotify")
				loud, okL := get("outbox-notify")
				if metric == "cpu-us/msg" {
					// Throughput the CPU cost allows: the inverse ratio.
					plain, table, loud, quiet = 1/plain, 1/table, 1/loud, 1/quiet
					metric = "1/(cpu-us/msg)"
				}
				fmt.Printf("%s: ratio of medians of %s: outbox(notify)/plain = %s, outbox(no notify)/plain = %s, notify/no-notify = %s, plain-pending/plain = %s, outbox(no notify)/plain-pending = %s\n",
					b.Name(), metric, ratio(loud, plain, okL, okP), ratio(quiet, plain, okQ, okP), ratio(loud, quiet, okL, okQ),
					ratio(table, plain, okT, okP), ratio(quiet, table, okQ, okT))
			}
		})
	}
}

func benchPublish(b *testing.B, e *env, v publishVariant, perTx int) {
	b.StopTimer()
	b.ResetTimer()
	ph, err := runPublish(context.Background(), e, b, v, perTx, b.N, false)
	if err != nil {
		b.Fatal(err)
	}
	warnCheckpoints(b, "publish", ph)
	m := map[string]float64{"msgs/s": ph.rate(), "WAL-B/msg": ph.walPerMsg()}
	addCPU(m, "", ph)
	if v.name != "plain" {
		if base, ok := lookup(sibling(b.Name(), "plain"), "msgs/s"); ok {
			m["x-plain"] = ph.rate() / base
		}
	}
	if v.name == "outbox-notify" {
		if base, ok := lookup(sibling(b.Name(), "outbox-nonotify"), "msgs/s"); ok {
			m["x-nonotify"] = ph.rate() / base
		}
	}
	report(b, m)
}
