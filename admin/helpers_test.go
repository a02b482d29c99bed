package admin_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type env struct {
	pool   *pgxpool.Pool
	schema string
	admin  *admin.Admin
	pub    *outbox.Publisher
}

func newEnv(t *testing.T) env {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	if err := outbox.Migrate(testCtx(t), pool, schema); err != nil {
		t.Fatal(err)
	}
	a, err := admin.New(admin.Config{Schema: schema, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return env{pool: pool, schema: schema, admin: a, pub: pub}
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

// publish publishes n keyless messages to topic in one call: the publisher
// spreads them round robin, so each partition gets its share in turn.
func (e env) publish(t *testing.T, topic string, n int, prefix string) {
	t.Helper()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(prefix+strconv.Itoa(i), []byte("p"))
	}
	if err := e.pub.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
}

func (e env) sequence(t *testing.T) {
	t.Helper()
	s, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.schema, Pool: e.pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SequenceAll(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

func (e env) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := e.pool.Exec(testCtx(t), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// cursor reads a cursor row: seq, owner ("" when none) and token.
func (e env) cursor(t *testing.T, group, topic string, partition int) (seq int64, owner string, token int64) {
	t.Helper()
	if err := e.pool.QueryRow(testCtx(t), `SELECT seq, coalesce(lease_owner, ''), lease_token FROM `+e.schema+`.cursors
		WHERE group_name = $1 AND topic = $2 AND partition = $3`, group, topic, partition).Scan(&seq, &owner, &token); err != nil {
		t.Fatal(err)
	}
	return seq, owner, token
}

func fastTuning() adaptive.Tuning {
	tu := adaptive.Default()
	tu.BatchSize = 32
	tu.BackoffBase = 20 * time.Millisecond
	tu.BackoffMax = 200 * time.Millisecond
	tu.LeaseTTL = 2 * time.Second
	tu.RenewInterval = 200 * time.Millisecond
	tu.Pacing.IdleInterval = 50 * time.Millisecond
	return tu
}

func (e env) subscriber(t *testing.T, group string) *outbox.Subscriber {
	t.Helper()
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
		Schema: e.schema, Pool: e.pool, ConsumerGroup: group, Tuning: fastTuning(),
		CloseTimeout: time.Second, DisableSequencer: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// delivery is one message as a handler saw it.
type delivery struct {
	partition int
	seq       int64
	uuid      string
}

// recorder collects deliveries; by default it acks each one.
type recorder struct {
	mu   sync.Mutex
	all  []delivery
	hold func(d delivery) bool // when true, the message is handed to held instead of acked
	held chan *message.Message
}

func (r *recorder) run(msgs <-chan *message.Message) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for m := range msgs {
			p, _ := strconv.Atoi(m.Metadata.Get(outbox.MetadataPartition))
			s, _ := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSeq), 10, 64)
			d := delivery{partition: p, seq: s, uuid: m.UUID}
			r.mu.Lock()
			r.all = append(r.all, d)
			hold := r.hold != nil && r.hold(d)
			r.mu.Unlock()
			if hold {
				r.held <- m
				continue
			}
			m.Ack()
		}
	}()
	return &wg
}

// seqs returns the seqs delivered from partition, in delivery order, from
// delivery number from on.
func (r *recorder) seqs(partition, from int) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int64
	for i, d := range r.all {
		if i >= from && d.partition == partition {
			out = append(out, d.seq)
		}
	}
	return out
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.all)
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func (e env) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(testCtx(t), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
