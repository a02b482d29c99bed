package inbox_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/inbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// at is a message at an outbox position, as the Subscriber, Kafka or NATS
// deliver it.
func at(topic string, partition int, seq int64, incarnation int64) *message.Message {
	m := message.NewMessage(topic+"/"+strconv.Itoa(partition)+"/"+strconv.FormatInt(seq, 10), []byte("x"))
	m.Metadata.Set(outbox.MetadataTopic, topic)
	m.Metadata.Set(outbox.MetadataPartition, strconv.Itoa(partition))
	m.Metadata.Set(outbox.MetadataSeq, strconv.FormatInt(seq, 10))
	m.Metadata.Set(outbox.MetadataIncarnation, strconv.FormatInt(incarnation, 10))
	return m
}

type env struct {
	b  *outboxtest.Bundle
	in *inbox.Inbox
}

func newEnv(t *testing.T, cfg inbox.Config) env {
	t.Helper()
	b := outboxtest.Setup(t)
	cfg.Pool, cfg.Schema = b.Pool, b.Schema+"_inbox"
	if cfg.Consumer == "" {
		cfg.Consumer = "billing"
	}
	if err := inbox.Migrate(outboxtest.Ctx(t), b.Pool, cfg.Schema); err != nil {
		t.Fatal(err)
	}
	b.Exec("CREATE TABLE " + b.Schema + ".effects (id bigint GENERATED ALWAYS AS IDENTITY, msg text NOT NULL)")
	in, err := inbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return env{b: b, in: in}
}

// process runs one delivery of msg in a transaction of its own; the
// effect is a row in effects.
func (e env) process(t *testing.T, msg *message.Message) (bool, error) {
	t.Helper()
	var took bool
	err := pgx.BeginFunc(context.Background(), e.b.Pool, func(tx pgx.Tx) error {
		var err error
		took, err = e.in.Process(context.Background(), tx, msg, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+e.b.Schema+".effects (msg) VALUES ($1)", msg.UUID)
			return err
		})
		return err
	})
	return took, err
}

func (e env) effects(t *testing.T) []string {
	t.Helper()
	rows, err := e.b.Pool.Query(context.Background(), "SELECT msg FROM "+e.b.Schema+".effects ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Duplicates are dropped, gaps are not waited for, partitions and
// consumers are independent, a failed handler records nothing.
func TestDuplicatesGapsAndFailures(t *testing.T) {
	e := newEnv(t, inbox.Config{})
	steps := []struct {
		msg  *message.Message
		took bool
	}{
		{at("orders", 0, 1, 7), true},
		{at("orders", 0, 1, 7), false}, // redelivery
		{at("orders", 0, 5, 7), true},  // a gap (2..4 dead-lettered upstream): not waited for
		{at("orders", 0, 3, 7), false}, // below the mark
		{at("orders", 1, 1, 7), true},  // another partition
		{at("invoices", 0, 1, 7), true},
	}
	for i, s := range steps {
		took, err := e.process(t, s.msg)
		if err != nil || took != s.took {
			t.Fatalf("step %d (%s): took %v, err %v; want took %v", i, s.msg.UUID, took, err, s.took)
		}
	}
	// A failing handler: nothing recorded, the message is processed on the
	// next delivery.
	fail := errors.New("handler failed")
	err := pgx.BeginFunc(context.Background(), e.b.Pool, func(tx pgx.Tx) error {
		_, err := e.in.Process(context.Background(), tx, at("orders", 0, 6, 7), func(context.Context, pgx.Tx) error { return fail })
		return err
	})
	if !errors.Is(err, fail) {
		t.Fatalf("handler failure: %v", err)
	}
	if took, err := e.process(t, at("orders", 0, 6, 7)); !took || err != nil {
		t.Fatalf("redelivery after a failure: took %v, err %v", took, err)
	}
	want := []string{"orders/0/1", "orders/0/5", "orders/1/1", "invoices/0/1", "orders/0/6"}
	if got := e.effects(t); len(got) != len(want) {
		t.Fatalf("effects %v, want %v", got, want)
	}
	if s := e.in.Stats(); s.Processed != 5 || s.Duplicates != 2 {
		t.Fatalf("stats %+v", s)
	}
	// Another consumer gets every message once too.
	other, err := inbox.New(inbox.Config{Pool: e.b.Pool, Schema: e.b.Schema + "_inbox", Consumer: "reporting"})
	if err != nil {
		t.Fatal(err)
	}
	if took, err := (env{b: e.b, in: other}).process(t, at("orders", 0, 1, 7)); !took || err != nil {
		t.Fatalf("another consumer: took %v, err %v", took, err)
	}
}

// A topic registered again (a new incarnation) starts over at seq 1; a
// message of the older incarnation after that is refused with a typed
// error; a message without the outbox position is refused, or passed
// through when configured.
func TestIncarnationsAndMessagesWithoutPosition(t *testing.T) {
	e := newEnv(t, inbox.Config{})
	if took, _ := e.process(t, at("orders", 0, 9, 100)); !took {
		t.Fatal("first message not processed")
	}
	if took, err := e.process(t, at("orders", 0, 1, 200)); !took || err != nil {
		t.Fatalf("seq 1 of a new incarnation: took %v, err %v", took, err)
	}
	_, err := e.process(t, at("orders", 0, 10, 100))
	var stale *inbox.StaleError
	if !errors.Is(err, inbox.ErrStale) || !errors.As(err, &stale) || stale.Recorded != 200 {
		t.Fatalf("older incarnation: %v", err)
	}
	plain := message.NewMessage("plain", []byte("x"))
	if _, err := e.process(t, plain); !errors.Is(err, inbox.ErrNoPosition) {
		t.Fatalf("no position: %v", err)
	}
	pass := newEnv(t, inbox.Config{WithoutPosition: inbox.PassThrough})
	if took, err := pass.process(t, plain); !took || err != nil {
		t.Fatalf("pass-through: took %v, err %v", took, err)
	}
	if _, err := inbox.New(inbox.Config{}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("no consumer: %v", err)
	}
}

// Redeliveries racing each other (a rebalance hands a partition to another
// consumer while the first still works; both deliver in seq order): every
// message takes effect exactly once, in seq order.
func TestConcurrentRedeliveriesTakeEffectOnceInOrder(t *testing.T) {
	e := newEnv(t, inbox.Config{})
	const n = 200
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := int64(1); seq <= n; seq++ {
				if _, err := e.process(t, at("orders", 0, seq, 1)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	got := e.effects(t)
	if len(got) != n {
		t.Fatalf("%d effects for %d messages", len(got), n)
	}
	for i, g := range got {
		if want := "orders/0/" + strconv.Itoa(i+1); g != want {
			t.Fatalf("effect %d is %s, want %s", i, g, want)
		}
	}
}

// As Watermill middleware: the handler's writes and the mark commit
// together; a redelivered message is acked without running the handler; a
// handler error rolls both back.
func TestMiddleware(t *testing.T) {
	e := newEnv(t, inbox.Config{})
	calls := 0
	h := e.in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		calls++
		tx, ok := outbox.TxFromContext[pgx.Tx](msg.Context())
		if !ok {
			return nil, errors.New("no transaction in the message context")
		}
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+e.b.Schema+".effects (msg) VALUES ($1)", msg.UUID); err != nil {
			return nil, err
		}
		if msg.Metadata.Get("fail") != "" {
			return nil, errors.New("handler failed after its write")
		}
		return nil, nil
	})
	m := at("orders", 0, 1, 1)
	for range 3 {
		if _, err := h(m); err != nil {
			t.Fatal(err)
		}
	}
	failing := at("orders", 0, 2, 1)
	failing.Metadata.Set("fail", "yes")
	if _, err := h(failing); err == nil {
		t.Fatal("the handler's error was swallowed")
	}
	failing.Metadata.Set("fail", "")
	if _, err := h(failing); err != nil {
		t.Fatal(err)
	}
	if got := e.effects(t); len(got) != 2 || calls != 3 {
		t.Fatalf("effects %v after %d handler calls; want 2 effects, 3 calls", got, calls)
	}
}

// Messages from the outbox Subscriber carry the position the inbox needs,
// incarnation included: delivered twice (a consumer restart that replays),
// each takes effect once.
func TestMessagesFromTheSubscriberTakeEffectOnce(t *testing.T) {
	e := newEnv(t, inbox.Config{})
	e.b.Register("orders", 2)
	for i := range 10 {
		e.b.Publish("orders", outboxtest.Keyed("m"+strconv.Itoa(i), "k"+strconv.Itoa(i%3), i, "x"))
	}
	e.b.SequenceAll()
	for round := range 2 { // the second group replays everything, as after a reset
		sub := e.b.Subscriber("g"+strconv.Itoa(round), nil)
		msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			m := <-msgs
			if m.Metadata.Get(outbox.MetadataIncarnation) == "" {
				t.Fatalf("no %s on a delivered message: %v", outbox.MetadataIncarnation, m.Metadata)
			}
			if _, err := e.process(t, m); err != nil {
				t.Fatal(err)
			}
			m.Ack()
		}
		_ = sub.Close()
	}
	if got := e.effects(t); len(got) != 10 {
		t.Fatalf("%d effects for 10 messages delivered twice", len(got))
	}
	if s := e.in.Stats(); s.Duplicates != 10 {
		t.Fatalf("stats %+v, want 10 duplicates dropped", s)
	}
}

// Nil arguments, and an Inbox that New did not make, are typed errors
// (the root package's vocabulary), never a panic, and run nothing.
func TestNilArgumentsAreTypedErrors(t *testing.T) {
	e := newEnv(t, inbox.Config{})
	ctx := outboxtest.Ctx(t)
	if err := inbox.Migrate(ctx, nil, e.b.Schema+"_other"); !errors.Is(err, outbox.ErrUnsupportedTx) {
		t.Errorf("Migrate(ctx, nil, schema): %v, want ErrUnsupportedTx (as outbox.Migrate)", err)
	}
	ran := false
	fn := func(context.Context, pgx.Tx) error { ran = true; return nil }
	tx, err := e.b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, c := range []struct {
		name string
		in   *inbox.Inbox
		tx   pgx.Tx
		msg  *message.Message
		fn   func(context.Context, pgx.Tx) error
		want error
	}{
		{"nil tx", e.in, nil, at("orders", 0, 1, 1), fn, outbox.ErrNilTx},
		{"nil msg", e.in, tx, nil, fn, outbox.ErrInvalidMessage},
		{"nil fn", e.in, tx, at("orders", 0, 1, 1), nil, outbox.ErrInvalidArgument},
		{"zero Inbox", new(inbox.Inbox), tx, at("orders", 0, 1, 1), fn, outbox.ErrInvalidArgument},
	} {
		took, err := c.in.Process(ctx, c.tx, c.msg, c.fn)
		if !errors.Is(err, c.want) || took {
			t.Errorf("Process with %s: took %v, %v; want %v", c.name, took, err, c.want)
		}
	}
	if ran {
		t.Error("fn ran on a refused call")
	}
	h := func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil }
	if _, err := e.in.Middleware(h)(nil); !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Errorf("Middleware(h)(nil): %v, want ErrInvalidMessage", err)
	}
	if _, err := e.in.Middleware(nil)(at("orders", 0, 1, 1)); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("Middleware(nil)(msg): %v, want ErrInvalidArgument", err)
	}
	if _, err := new(inbox.Inbox).Middleware(h)(at("orders", 0, 1, 1)); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("Inbox{}.Middleware(h)(msg): %v, want ErrInvalidArgument", err)
	}
	if ran {
		t.Error("the handler ran on a refused call")
	}
	if got := e.effects(t); len(got) != 0 {
		t.Errorf("effects %v after refused calls", got)
	}
}

// An inbox schema that Migrate never ran on (or that was dropped) is
// outbox.ErrNotMigrated naming inbox.Migrate, through Process and the
// middleware, not PostgreSQL's "relation does not exist".
func TestUnmigratedSchemaIsErrNotMigrated(t *testing.T) {
	b := outboxtest.Setup(t)
	ctx := outboxtest.Ctx(t)
	schema := b.Schema + "_inbox"
	in, err := inbox.New(inbox.Config{Pool: b.Pool, Schema: schema, Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error) {
		t.Helper()
		var nm *outboxtype.NotMigratedError
		if !errors.Is(err, outbox.ErrNotMigrated) || !errors.As(err, &nm) || nm.Schema != schema {
			t.Fatalf("%s: %v, want ErrNotMigrated for %q", what, err, schema)
		}
		if !strings.Contains(err.Error(), "inbox.Migrate(ctx, pool, \""+schema+"\")") {
			t.Fatalf("%s: %q does not say to run inbox.Migrate", what, err)
		}
	}
	process := func() error {
		return pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
			_, err := in.Process(ctx, tx, at("orders", 0, 1, 1), func(context.Context, pgx.Tx) error { return nil })
			return err
		})
	}
	check("Process, schema missing", process())
	_, err = in.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(at("orders", 0, 1, 1))
	check("Middleware, schema missing", err)
	// The schema exists, the table does not.
	b.Exec("CREATE SCHEMA " + schema)
	check("Process, table missing", process())
	if err := inbox.Migrate(ctx, b.Pool, schema); err != nil {
		t.Fatal(err)
	}
	if err := process(); err != nil {
		t.Fatalf("after Migrate: %v", err)
	}
	// Dropped later.
	b.Exec("DROP SCHEMA " + schema + " CASCADE")
	check("Process, schema dropped", process())
}
