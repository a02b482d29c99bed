// Package outboxtest is the test fixture of the outbox's own tests (River's
// testBundle + setup(t) pattern): one call gives a test a real PostgreSQL
// pool and a freshly migrated schema of its own, and the bundle's methods
// do the chores every test repeats (register a topic, publish, sequence,
// read a cursor, run SQL, start a Subscriber that is closed with the test).
// Failures end the test; nothing to check by hand.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		b := outboxtest.Setup(t, outboxtest.NoLeaks())
//		b.Register("orders", 4)
//		b.Publish("orders", outboxtest.Keyed("m1", "k1", 1, "payload"))
//		b.SequenceAll()
//		...
//	}
//
// Only _test.go files import it.
package outboxtest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Bundle is one test's outbox.
type Bundle struct {
	T      testing.TB
	Pool   *pgxpool.Pool
	Schema string
}

// Option changes what Setup does.
type Option func(*options)

type options struct {
	noLeaks bool
}

// NoLeaks makes the test fail when it leaves a goroutine behind, checked
// after everything else the test registered with t.Cleanup (the pool is
// closed by then).
func NoLeaks() Option { return func(o *options) { o.noLeaks = true } }

// Setup gives t a pool on the test server (see internal/pgtest) and a schema
// of its own, migrated.
func Setup(t testing.TB, opts ...Option) *Bundle {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.noLeaks {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs last
	}
	b := &Bundle{T: t, Pool: pgtest.Pool(t), Schema: pgtest.Schema(t)}
	if err := outbox.Migrate(Ctx(t), b.Pool, b.Schema); err != nil {
		t.Fatal(err)
	}
	return b
}

// Ctx is a context that ends with the test, or after 3 minutes.
func Ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return c
}

// Register registers topic with partitions partitions.
func (b *Bundle) Register(topic string, partitions int) {
	b.T.Helper()
	if err := outbox.RegisterTopic(Ctx(b.T), b.Pool, b.Schema, topic, partitions); err != nil {
		b.T.Fatal(err)
	}
}

// Publisher returns a Publisher of the bundle's schema that writes in
// transactions of its own (OwnTransaction); edit, when set, changes its
// config first.
func (b *Bundle) Publisher(edit func(*outbox.PublisherConfig)) *outbox.Publisher {
	b.T.Helper()
	cfg := outbox.PublisherConfig{Schema: b.Schema, DB: b.Pool, OwnTransaction: true}
	if edit != nil {
		edit(&cfg)
	}
	pub, err := outbox.NewPublisher(cfg, nil)
	if err != nil {
		b.T.Fatal(err)
	}
	return pub
}

// Publish publishes msgs to topic in one transaction of its own.
func (b *Bundle) Publish(topic string, msgs ...*message.Message) {
	b.T.Helper()
	if err := b.Publisher(nil).Publish(topic, msgs...); err != nil {
		b.T.Fatal(err)
	}
}

// PublishN publishes n keyless messages with uuids prefix0, prefix1, ... in
// one call: the publisher spreads them round robin over the partitions.
func (b *Bundle) PublishN(topic string, n int, prefix string) {
	b.T.Helper()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(prefix+strconv.Itoa(i), []byte("p"))
	}
	b.Publish(topic, msgs...)
}

// Keyed is a message with partition key key and metadata "n" (a count per
// key, from 1).
func Keyed(uuid, key string, n int, payload string) *message.Message {
	m := message.NewMessage(uuid, []byte(payload))
	m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
	m.Metadata.Set("n", strconv.Itoa(n))
	return m
}

// SequenceAll sequences every pending message and returns how many.
func (b *Bundle) SequenceAll() int {
	b.T.Helper()
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		b.T.Fatal(err)
	}
	n, err := seq.SequenceAll(Ctx(b.T))
	if err != nil {
		b.T.Fatal(err)
	}
	return n
}

// Exec runs sql.
func (b *Bundle) Exec(sql string, args ...any) {
	b.T.Helper()
	if _, err := b.Pool.Exec(Ctx(b.T), sql, args...); err != nil {
		b.T.Fatalf("%s: %v", sql, err)
	}
}

// Int runs sql, which returns one integer (a count, say).
func (b *Bundle) Int(sql string, args ...any) int64 {
	b.T.Helper()
	var n int64
	if err := b.Pool.QueryRow(Ctx(b.T), sql, args...).Scan(&n); err != nil {
		b.T.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Rows counts the rows of one of the schema's tables (pending, log, ...).
func (b *Bundle) Rows(table string) int {
	b.T.Helper()
	return int(b.Int("SELECT count(*) FROM " + b.Schema + "." + table))
}

// Cursor reads a cursor row: its seq, lease owner ("" when none) and lease
// token.
func (b *Bundle) Cursor(group, topic string, partition int) (seq int64, owner string, token int64) {
	b.T.Helper()
	if err := b.Pool.QueryRow(Ctx(b.T), `SELECT seq, coalesce(lease_owner, ''), lease_token FROM `+b.Schema+`.cursors
		WHERE group_name = $1 AND topic = $2 AND partition = $3`, group, topic, partition).Scan(&seq, &owner, &token); err != nil {
		b.T.Fatal(err)
	}
	return seq, owner, token
}

// FastTuning is adaptive.Default with the timings of a test: short leases
// and backoff, batches of 32. Use it with FastAdvanced.
func FastTuning() adaptive.Tuning {
	tu := adaptive.Default()
	tu.BatchSize = 32
	tu.BackoffBase = 20 * time.Millisecond
	tu.BackoffMax = 200 * time.Millisecond
	tu.LeaseTTL = 2 * time.Second
	return tu
}

// FastAdvanced is the Advanced config of a test: a 50 ms idle poll.
func FastAdvanced() outbox.Advanced {
	return outbox.Advanced{PollInterval: 50 * time.Millisecond}
}

// Subscriber starts a Subscriber of group on the bundle's schema, with
// FastTuning, FastAdvanced and a CloseTimeout of 1 s, closed when the test
// ends; edit, when set, changes its config first.
func (b *Bundle) Subscriber(group string, edit func(*outbox.SubscriberConfig)) *outbox.Subscriber {
	b.T.Helper()
	cfg := outbox.SubscriberConfig{
		Schema: b.Schema, Pool: b.Pool, ConsumerGroup: group, Tuning: FastTuning(), Advanced: FastAdvanced(), CloseTimeout: time.Second,
	}
	if edit != nil {
		edit(&cfg)
	}
	sub, err := outbox.NewSubscriber(cfg, nil)
	if err != nil {
		b.T.Fatal(err)
	}
	b.T.Cleanup(func() { _ = sub.Close() })
	return sub
}

// HoldingConsumer subscribes group to topic with key isolation, rejects to
// rejects, and retries an hour apart (so that only an operator retries): it
// nacks every message whose partition key is in poisoned and acks the
// others, until the test ends.
func (b *Bundle) HoldingConsumer(group, topic string, rejects outboxtype.RejectHandler, poisoned ...string) {
	b.T.Helper()
	sub := b.Subscriber(group, func(c *outbox.SubscriberConfig) {
		c.KeyIsolation.Enabled = true
		c.RejectHandler = rejects
		c.Tuning.BackoffBase, c.Tuning.BackoffMax = time.Hour, time.Hour
	})
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		b.T.Fatal(err)
	}
	go func() {
		for m := range msgs {
			if slices.Contains(poisoned, m.Metadata.Get(outbox.MetadataPartitionKey)) {
				m.Nack()
			} else {
				m.Ack()
			}
		}
	}()
}

// RejectingConsumer subscribes group to topic with rejects as its
// RejectHandler and rejects every message it is delivered (outbox.Reject),
// until the test ends: with a deadletter.Store, each message becomes a dead
// letter.
func (b *Bundle) RejectingConsumer(group, topic string, rejects outboxtype.RejectHandler) {
	b.T.Helper()
	sub := b.Subscriber(group, func(c *outbox.SubscriberConfig) { c.RejectHandler = rejects })
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		b.T.Fatal(err)
	}
	go func() {
		for m := range msgs {
			_ = outbox.Reject(m, errors.New("rejected by outboxtest.RejectingConsumer"))
			m.Nack()
		}
	}()
}

// WaitFor polls cond every 10 ms until it holds and returns how long that
// took, failing the test after timeout.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// WithPool is the bundle on another pool of the same server (a freezable
// one, say): same test, same schema.
func (b *Bundle) WithPool(pool *pgxpool.Pool) *Bundle {
	c := *b
	c.Pool = pool
	return &c
}

// Attach is the bundle of a schema migrated elsewhere (by the parent of a
// child process, say), on pool.
func Attach(t testing.TB, pool *pgxpool.Pool, schema string) *Bundle {
	return &Bundle{T: t, Pool: pool, Schema: schema}
}

// OwnCluster starts a throwaway PostgreSQL server of the test's own, with
// settings (for a test that restarts or crashes it, or needs a setting the
// shared server lacks), and returns a bundle on it with schema migrated.
// Server and pool are stopped when the test ends.
func OwnCluster(t testing.TB, settings map[string]string, schema string) (*Bundle, *pgcluster.Cluster) {
	t.Helper()
	ctx := Ctx(t)
	cluster, err := pgtest.StartCluster(ctx, pgcluster.Options{Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	pool, err := pgxpool.New(ctx, cluster.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	return Attach(t, pool, schema), cluster
}

// Shard is a bundle on a database of its own on the test server (dropped
// when the test ends) with schema migrated: one shard of a sharded
// application, whose outbox schema is named as every other shard's.
func Shard(t testing.TB, schema string) *Bundle {
	t.Helper()
	ctx := Ctx(t)
	pool, err := pgxpool.New(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	return Attach(t, pool, schema)
}

// Listen listens on channel on a connection of its own, held until the
// test ends, and returns heard: the payloads of the notifications sent on
// channel since the last call. heard sends a marker last and reads up to
// it (notifications arrive in commit order), so it waits for no clock.
func (b *Bundle) Listen(channel string) (heard func() []string) {
	b.T.Helper()
	ctx := Ctx(b.T)
	conn, err := b.Pool.Acquire(ctx)
	if err != nil {
		b.T.Fatal(err)
	}
	b.T.Cleanup(conn.Release)
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		b.T.Fatal(err)
	}
	const marker = "outboxtest:marker"
	return func() []string {
		b.T.Helper()
		if _, err := b.Pool.Exec(ctx, "SELECT pg_notify($1, $2)", channel, marker); err != nil {
			b.T.Fatal(err)
		}
		var got []string
		for {
			n, err := conn.Conn().WaitForNotification(ctx)
			if err != nil {
				b.T.Fatal(err)
			}
			if n.Payload == marker {
				return got
			}
			got = append(got, n.Payload)
		}
	}
}
