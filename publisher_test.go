package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// oddMessage has a payload with every byte value and metadata with quotes,
// backslashes, control characters and non-ASCII text.
func oddMessage(uuid, key string) *message.Message {
	payload := make([]byte, 0, 512)
	for i := 0; i < 512; i++ {
		payload = append(payload, byte(i))
	}
	m := message.NewMessage(uuid, payload)
	m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
	m.Metadata.Set(`quote"back\slash`, "tab\tnewline\nbell\x07 ünïcødé 🚀 <&>")
	m.Metadata.Set("empty", "")
	return m
}

func assertSameMessage(t *testing.T, got logRow, want *message.Message) {
	t.Helper()
	if got.UUID != want.UUID {
		t.Fatalf("uuid = %q, want %q", got.UUID, want.UUID)
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		t.Fatalf("payload differs: %x vs %x", got.Payload, want.Payload)
	}
	if len(got.Metadata) != len(want.Metadata) {
		t.Fatalf("metadata = %q, want %q", got.Metadata, want.Metadata)
	}
	for k, v := range want.Metadata {
		if got.Metadata[k] != v {
			t.Fatalf("metadata[%q] = %q, want %q", k, got.Metadata[k], v)
		}
	}
}

func TestPublishInEveryKindOfTransactionIsByteExact(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 4)
	cfg := outbox.PublisherConfig{Schema: e.Schema}
	db := pgtest.DB(t)

	kinds := map[string]func(t *testing.T, msgs []*message.Message, commit bool){
		"pgx.Tx": func(t *testing.T, msgs []*message.Message, commit bool) {
			tx, err := e.Pool.Begin(outboxtest.Ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			pub, err := outbox.NewTxPublisher(tx, cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Publish("orders", msgs...); err != nil {
				t.Fatal(err)
			}
			finish(t, commit, func() error { return tx.Commit(outboxtest.Ctx(t)) }, func() error { return tx.Rollback(outboxtest.Ctx(t)) })
		},
		"*sql.Tx": func(t *testing.T, msgs []*message.Message, commit bool) {
			tx, err := db.BeginTx(outboxtest.Ctx(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			pub, err := outbox.NewTxPublisher(tx, cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Publish("orders", msgs...); err != nil {
				t.Fatal(err)
			}
			finish(t, commit, tx.Commit, tx.Rollback)
		},
		"watermill-sql std executor": func(t *testing.T, msgs []*message.Message, commit bool) {
			beginner := wsql.BeginnerFromStdSQL(db)
			tx, err := beginner.BeginTx(outboxtest.Ctx(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			pub, err := outbox.NewTxPublisher(tx, cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Publish("orders", msgs...); err != nil {
				t.Fatal(err)
			}
			finish(t, commit, tx.Commit, tx.Rollback)
		},
		"watermill-sql pgx executor": func(t *testing.T, msgs []*message.Message, commit bool) {
			beginner := wsql.BeginnerFromPgx(e.Pool)
			tx, err := beginner.BeginTx(outboxtest.Ctx(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			pub, err := outbox.NewTxPublisher(tx, cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Publish("orders", msgs...); err != nil {
				t.Fatal(err)
			}
			finish(t, commit, tx.Commit, tx.Rollback)
		},
		"context-bound pgx.Tx": func(t *testing.T, msgs []*message.Message, commit bool) {
			pub, err := outbox.NewPublisher(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			tx, err := e.Pool.Begin(outboxtest.Ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				m.SetContext(outbox.WithTx(outboxtest.Ctx(t), tx))
			}
			if err := pub.Publish("orders", msgs...); err != nil {
				t.Fatal(err)
			}
			finish(t, commit, func() error { return tx.Commit(outboxtest.Ctx(t)) }, func() error { return tx.Rollback(outboxtest.Ctx(t)) })
		},
	}
	for name, publish := range kinds {
		t.Run(name, func(t *testing.T) {
			// One message per call (a VALUES insert) and several per call
			// (an unnest insert) take different statements.
			committed := oddMessage("commit-"+name, "key-"+name)
			rolledBack := oddMessage("rollback-"+name, "key-"+name)
			pair := []*message.Message{oddMessage("pair1-"+name, "key-"+name), oddMessage("pair2-"+name, "other-"+name)}
			publish(t, []*message.Message{committed}, true)
			publish(t, []*message.Message{rolledBack}, false)
			publish(t, pair, true)
			e.SequenceAll()
			want := map[string]*message.Message{committed.UUID: committed, pair[0].UUID: pair[0], pair[1].UUID: pair[1]}
			found := map[string]logRow{}
			for _, r := range e.readLog(t, "orders") {
				if r.UUID == rolledBack.UUID {
					t.Fatalf("the rolled-back message is in the log (%s)", name)
				}
				if want[r.UUID] != nil {
					found[r.UUID] = r
				}
			}
			if len(found) != len(want) {
				t.Fatalf("found %d of the %d committed messages for %s", len(found), len(want), name)
			}
			for id, m := range want {
				assertSameMessage(t, found[id], m)
				if k := found[id].Key; k == nil || *k != m.Metadata.Get(outbox.PublishPartitionKeyMetadata) {
					t.Fatalf("partition key = %v, want %q", k, m.Metadata.Get(outbox.PublishPartitionKeyMetadata))
				}
			}
		})
	}
}

func finish(t *testing.T, commit bool, commitFn, rollbackFn func() error) {
	t.Helper()
	fn := rollbackFn
	if commit {
		fn = commitFn
	}
	if err := fn(); err != nil {
		t.Fatal(err)
	}
}

// queryCounter counts the round trips a pgx connection makes: each
// statement sent alone and each pipeline (pgx batch) is one.
type queryCounter struct{ n atomic.Int64 }

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *queryCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *queryCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *queryCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// countingPool is a pool of the test database whose round trips counter
// counts.
func countingPool(t *testing.T) (*pgxpool.Pool, *queryCounter) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	counter := &queryCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(outboxtest.Ctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, counter
}

func TestPublishIsOneRoundTripAndKeepsOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	pool, counter := countingPool(t)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for round := 0; round < 3; round++ {
		tx, err := pool.Begin(outboxtest.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background()) // no-op after Commit; frees the pool on failure
		var msgs []*message.Message
		for i := 0; i < 500; i++ {
			m := message.NewMessage(string(rune('a'+round))+"-"+itoa(i), []byte("x"))
			m.SetContext(outbox.WithTx(outboxtest.Ctx(t), tx))
			msgs = append(msgs, m)
			want = append(want, m.UUID)
		}
		before := counter.n.Load()
		if err := pub.Publish("orders", msgs...); err != nil {
			t.Fatal(err)
		}
		statements := counter.n.Load() - before
		// The first Publish also checks the schema's version and looks the
		// topic up, once each; later ones are one statement for 500
		// messages.
		if limit := int64(1); round == 0 && statements > 3 || round > 0 && statements != limit {
			t.Fatalf("round %d: Publish of 500 messages sent %d statements", round, statements)
		}
		if err := tx.Commit(outboxtest.Ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	e.SequenceAll()
	rows := e.readLog(t, "orders")
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rows), len(want))
	}
	for i, r := range rows {
		if r.UUID != want[i] || r.Seq != int64(i+1) {
			t.Fatalf("row %d: uuid %s seq %d, want %s seq %d", i, r.UUID, r.Seq, want[i], i+1)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// One way registers a topic, RegisterTopic: a Publisher does not register
// what it meets (it refuses an unregistered topic, saying how to register
// it, and writes nothing), and publishes into the topic once registered.
func TestOwnTransactionAndUnregisteredTopics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = pub.Publish("orders", message.NewMessage("m1", []byte("a")))
	if !errors.Is(err, outbox.ErrUnknownTopic) || !strings.Contains(err.Error(), "outbox.RegisterTopic") || !strings.Contains(err.Error(), "outbox topics register orders") {
		t.Fatalf("Publish to an unregistered topic: %v, want ErrUnknownTopic saying how to register it", err)
	}
	if n := e.Rows("pending"); n != 0 {
		t.Fatalf("%d rows written for an unregistered topic", n)
	}
	if _, err := outbox.TopicPartitions(outboxtest.Ctx(t), e.Pool, e.Schema, "orders"); !errors.Is(err, outbox.ErrUnknownTopic) {
		t.Fatalf("the Publisher registered the topic: %v", err)
	}
	if err := outbox.RegisterTopic(outboxtest.Ctx(t), e.Pool, e.Schema, "orders", 8); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage("m2", []byte("b"))); err != nil {
		t.Fatal(err)
	}
	if n := e.SequenceAll(); n != 1 {
		t.Fatalf("sequenced %d, want 1", n)
	}
}

func TestKeylessMessagesAreSpreadEvenly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("spread", 8)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*message.Message
	for i := 0; i < 800; i++ {
		msgs = append(msgs, message.NewMessage("k"+itoa(i), nil))
	}
	if err := pub.Publish("spread", msgs...); err != nil {
		t.Fatal(err)
	}
	e.SequenceAll()
	per := map[int]int{}
	for _, r := range e.readLog(t, "spread") {
		per[r.Partition]++
		if r.Key != nil {
			t.Fatalf("keyless message stored with key %q", *r.Key)
		}
	}
	for p := 0; p < 8; p++ {
		if per[p] != 100 {
			t.Fatalf("partition %d got %d messages, want 100 (%v)", p, per[p], per)
		}
	}
}

func TestCustomPartitionKeyFunc(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("custom", 16)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{
		Schema: e.Schema, DB: e.Pool, OwnTransaction: true,
		PartitionKeyFunc: func(topic string, m *message.Message) (string, error) {
			if m.Metadata.Get("tenant") == "" {
				return "", errors.New("no tenant")
			}
			return m.Metadata.Get("tenant"), nil
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := message.NewMessage("a", nil)
	a.Metadata.Set("tenant", "acme")
	if err := pub.Publish("custom", a); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("custom", message.NewMessage("b", nil)); err == nil || !strings.Contains(err.Error(), "no tenant") {
		t.Fatalf("err = %v, want the key func's error", err)
	}
	e.SequenceAll()
	rows := e.readLog(t, "custom")
	if len(rows) != 1 || rows[0].Key == nil || *rows[0].Key != "acme" {
		t.Fatalf("rows = %+v", rows)
	}
}

// Payloads of 1 KiB or more are written once, into bodies, by every publish
// statement (one message or many, with or without NOTIFY); the sequencer
// moves only their id, and every reader gets the bytes back exactly.
func TestLargePayloadsAreWrittenOnceAndReadBackExactly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("big", 2)
	sizes := []int{0, 1, 1023, 1024, 1025, 4096, 70000}
	payload := func(size, salt int) []byte {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(i*7 + salt)
		}
		return b
	}
	want := map[string][]byte{}
	for _, notify := range []bool{true, false} {
		pub := e.Publisher(func(c *outbox.PublisherConfig) { c.DisableNotify = !notify })
		for salt, size := range sizes {
			// One message per call (PendingInsertOne…) and all sizes in one
			// call (PendingInsert…).
			one := message.NewMessage(fmt.Sprintf("one-%v-%d", notify, size), payload(size, salt))
			if err := pub.Publish("big", one); err != nil {
				t.Fatal(err)
			}
			want[one.UUID] = one.Payload
		}
		var many []*message.Message
		for salt, size := range sizes {
			m := message.NewMessage(fmt.Sprintf("many-%v-%d", notify, size), payload(size, salt+100))
			m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "k")
			many = append(many, m)
			want[m.UUID] = m.Payload
		}
		if err := pub.Publish("big", many...); err != nil {
			t.Fatal(err)
		}
	}
	large := 0
	for _, p := range want {
		if len(p) >= 1024 {
			large++
		}
	}
	if n := e.Int("SELECT count(*) FROM " + e.Schema + ".pending WHERE body_id IS NOT NULL AND payload IS NULL"); n != int64(large) {
		t.Fatalf("%d pending rows point to a body, want %d", n, large)
	}
	if n := e.Int("SELECT count(*) FROM " + e.Schema + ".pending WHERE octet_length(payload) >= 1024"); n != 0 {
		t.Fatalf("%d pending rows carry a payload of 1 KiB or more inline", n)
	}
	e.SequenceAll()
	if n := e.Rows("bodies"); n != large {
		t.Fatalf("%d bodies, want %d", n, large)
	}
	if n := e.Int("SELECT count(*) FROM " + e.Schema + ".log WHERE body_id IS NOT NULL AND payload IS NULL"); n != int64(large) {
		t.Fatalf("%d log rows point to a body, want %d", n, large)
	}
	for _, r := range e.readLog(t, "big") {
		if !bytes.Equal(r.Payload, want[r.UUID]) {
			t.Fatalf("log: payload of %s: %d bytes, differs from the %d published", r.UUID, len(r.Payload), len(want[r.UUID]))
		}
	}

	// Through a Subscriber (log.sql's reads).
	sub := e.Subscriber("readers", nil)
	ch, err := sub.Subscribe(outboxtest.Ctx(t), "big")
	if err != nil {
		t.Fatal(err)
	}
	for range len(want) {
		select {
		case m := <-ch:
			if !bytes.Equal(m.Payload, want[m.UUID]) {
				t.Fatalf("subscriber: payload of %s: %d bytes, differs from the %d published", m.UUID, len(m.Payload), len(want[m.UUID]))
			}
			delete(want, m.UUID)
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("subscriber: %d messages not delivered", len(want))
		}
	}
}
