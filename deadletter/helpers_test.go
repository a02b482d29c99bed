package deadletter_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's outbox: a pool, a freshly migrated schema and a store.
// When the test ends it checks that no goroutine the test started is left.
type env struct {
	pool   *pgxpool.Pool
	schema string
	store  *deadletter.Store
}

func newEnv(t *testing.T) env {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs last, after the pool is closed
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	if err := outbox.Migrate(testCtx(t), pool, schema); err != nil {
		t.Fatal(err)
	}
	store, err := deadletter.NewStore(deadletter.Config{Schema: schema, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return env{pool: pool, schema: schema, store: store}
}

func testCtx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func (e env) register(t *testing.T, topic string, partitions int) {
	t.Helper()
	if err := outbox.RegisterTopic(testCtx(t), e.pool, e.schema, topic, partitions); err != nil {
		t.Fatal(err)
	}
}

// publish publishes one message per payload, with key as partition key and
// metadata "n" counting from 1, in one transaction of its own.
func (e env) publish(t *testing.T, topic string, msgs ...*message.Message) {
	t.Helper()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.schema, DB: e.pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
}

func keyed(uuid, key string, n int, payload string) *message.Message {
	m := message.NewMessage(uuid, []byte(payload))
	m.Metadata.Set(outbox.PartitionKeyMetadata, key)
	m.Metadata.Set("n", strconv.Itoa(n))
	return m
}

func (e env) count(t *testing.T, f deadletter.Filter) int64 {
	t.Helper()
	n, err := e.store.Count(testCtx(t), f)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (e env) queryInt(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(testCtx(t), sql, args...).Scan(&n); err != nil {
		t.Fatal(fmt.Errorf("%s: %w", sql, err))
	}
	return n
}

func fastTuning() adaptive.Tuning {
	tu := adaptive.Default()
	tu.BatchSize = 32
	tu.BackoffBase = 20 * time.Millisecond
	tu.BackoffMax = 200 * time.Millisecond
	tu.LeaseTTL = 2 * time.Second
	tu.RenewInterval = 300 * time.Millisecond
	tu.Pacing.IdleInterval = 100 * time.Millisecond
	return tu
}

func (e env) subscriber(t *testing.T, group string, tune func(*outbox.SubscriberConfig)) *outbox.Subscriber {
	t.Helper()
	cfg := outbox.SubscriberConfig{
		Schema: e.schema, Pool: e.pool, ConsumerGroup: group, Tuning: fastTuning(),
		CloseTimeout: time.Second, RejectHandler: e.store,
	}
	if tune != nil {
		tune(&cfg)
	}
	sub, err := outbox.NewSubscriber(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func strategies() []outbox.Strategy { return []outbox.Strategy{outbox.Leased, outbox.Transactional} }
