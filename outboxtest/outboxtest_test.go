package outboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fakeTB records a failure instead of failing, to test the failure
// messages. Only the methods the package calls are implemented.
type fakeTB struct {
	testing.TB
	failed bool
	msg    string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = true
	f.msg = fmt.Sprintf(format, args...)
}

// env is a pool and a schema of the test's own (outboxtest.Schema) with
// topic "orders" of 3 partitions.
func env(t *testing.T) (*pgxpool.Pool, string) {
	pool := pgtest.Pool(t)
	schema := outboxtest.Schema(t, pool)
	if err := outbox.RegisterTopic(context.Background(), pool, schema, "orders", 3); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

func order(id int, customer string) *message.Message {
	m := message.NewMessage(fmt.Sprintf("order-%d", id), fmt.Appendf(nil, `{"order_id":%d,"customer":%q,"lines":[{"sku":"a"}]}`, id, customer))
	m.Metadata.Set(outbox.PublishPartitionKeyMetadata, customer)
	m.Metadata.Set("type", "OrderPlaced")
	return m
}

func publishTx(t *testing.T, tx pgx.Tx, schema string, msgs ...*message.Message) {
	t.Helper()
	pub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", msgs...); err != nil {
		t.Fatal(err)
	}
}

// publishCommitted publishes msgs in a transaction of their own.
func publishCommitted(t *testing.T, pool *pgxpool.Pool, schema string, msgs ...*message.Message) {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	publishTx(t, tx, schema, msgs...)
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// RequirePublishedTx sees the test's own uncommitted messages,
// RequirePublished through the pool only committed ones, pending or
// sequenced; every kind of match narrows, and Times counts.
func TestRequirePublishedSeesWhatEachHandleSees(t *testing.T) {
	pool, schema := env(t)
	ctx := context.Background()
	in := outboxtest.InSchema(schema)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	publishTx(t, tx, schema, order(42, "c-1"), order(43, "c-2"), order(44, "c-1"))

	got := outboxtest.RequirePublishedTx(t, tx, "orders", in, outboxtest.Key("c-1"), outboxtest.Times(2))
	if got[0].UUID != "order-42" || got[1].UUID != "order-44" || got[0].Seq != 0 || got[0].Metadata["type"] != "OrderPlaced" {
		t.Fatalf("RequirePublishedTx: %+v", got)
	}
	outboxtest.RequireNotPublished(t, pool, "orders", in) // not committed: invisible to others

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	p := outboxtest.RequirePublished(t, pool, "orders", in, outboxtest.JSON(map[string]any{"order_id": 42, "lines": []any{map[string]any{"sku": "a"}}}))
	if len(p) != 1 || p[0].UUID != "order-42" || p[0].Seq != 0 {
		t.Fatalf("pending order 42: %+v", p)
	}
	outboxtest.RequirePublished(t, pool, "orders", in, outboxtest.JSON(`{"customer":"c-2"}`), outboxtest.Metadata("type", "OrderPlaced"), outboxtest.Times(1))
	outboxtest.RequirePublished(t, pool, "orders", in, outboxtest.PayloadEquals(order(43, "c-2").Payload))
	outboxtest.RequirePublished(t, pool, "orders", in, outboxtest.Payload("mentions c-1", func(b []byte) bool { return strings.Contains(string(b), "c-1") }), outboxtest.Times(2))
	outboxtest.RequireNotPublished(t, pool, "orders", in, outboxtest.JSON(map[string]any{"order_id": 99}))
	outboxtest.RequireNotPublished(t, pool, "orders", in, outboxtest.Key("c-1"), outboxtest.Metadata("type", "OrderCancelled"))

	// Sequenced, the same messages are found with their seq.
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seq.SequenceAll(ctx); err != nil {
		t.Fatal(err)
	}
	all := outboxtest.RequirePublished(t, pool, "orders", in, outboxtest.Times(3))
	for _, m := range all {
		if m.Seq == 0 {
			t.Fatalf("after sequencing, %s has no seq", m.UUID)
		}
	}
}

// Failures say what was looked for and list what the topic holds.
func TestFailureMessagesListWhatWasPublished(t *testing.T) {
	pool, schema := env(t)
	in := outboxtest.InSchema(schema)
	publishCommitted(t, pool, schema, order(1, "c-1"), order(2, "c-2"))

	f := &fakeTB{}
	if got := outboxtest.RequirePublished(f, pool, "orders", in, outboxtest.Key("c-9")); got != nil || !f.failed {
		t.Fatalf("no match: returned %v, failed %v", got, f.failed)
	}
	for _, want := range []string{`no message of topic "orders" matches key "c-9"`, `topic holds 2 message(s)`, `uuid "order-1" key "c-1"`, `uuid "order-2" key "c-2"`, `type="OrderPlaced"`, `"order_id":2`, "pending"} {
		if !strings.Contains(f.msg, want) {
			t.Errorf("failure message lacks %q:\n%s", want, f.msg)
		}
	}

	f = &fakeTB{}
	outboxtest.RequirePublished(f, pool, "orders", in, outboxtest.Metadata("type", "OrderPlaced"), outboxtest.Times(1))
	if !f.failed || !strings.Contains(f.msg, `2 messages of topic "orders" match metadata type="OrderPlaced", want 1`) || !strings.Contains(f.msg, "matching 2 message(s)") {
		t.Errorf("Times mismatch: %q", f.msg)
	}

	// Times(1) with nothing matching lists what the topic holds.
	f = &fakeTB{}
	outboxtest.RequirePublished(f, pool, "orders", in, outboxtest.Key("c-9"), outboxtest.Times(1))
	if !f.failed || !strings.Contains(f.msg, `no message of topic "orders" matches key "c-9", want 1`) || !strings.Contains(f.msg, "topic holds 2 message(s)") || !strings.Contains(f.msg, `uuid "order-2"`) {
		t.Errorf("Times(1) without a match: %q", f.msg)
	}

	f = &fakeTB{}
	outboxtest.RequireNotPublished(f, pool, "orders", in, outboxtest.JSON(map[string]any{"customer": "c-1"}))
	if !f.failed || !strings.Contains(f.msg, `1 messages of topic "orders" match JSON containing {"customer":"c-1"}, want none`) || !strings.Contains(f.msg, `uuid "order-1"`) || strings.Contains(f.msg, `uuid "order-2"`) {
		t.Errorf("RequireNotPublished: %q", f.msg)
	}

	f = &fakeTB{}
	outboxtest.RequirePublished(f, pool, "invoices", in)
	if !f.failed || !strings.Contains(f.msg, `no message of topic "invoices" matches anything`) || !strings.Contains(f.msg, "topic holds no message") {
		t.Errorf("empty topic: %q", f.msg)
	}

	f = &fakeTB{}
	outboxtest.RequirePublished(f, "not a database", "orders", in)
	if !f.failed || !strings.Contains(f.msg, "want a pool, *sql.DB or transaction, got string") {
		t.Errorf("bad handle: %q", f.msg)
	}
}

// Sequenced matches only what a sequencer numbered: a committed message
// that waits in pending fails it, and the failure says that no sequencer
// ran; once sequenced, it passes.
func TestSequencedFailsUntilASequencerRan(t *testing.T) {
	pool, schema := env(t)
	in := outboxtest.InSchema(schema)
	publishCommitted(t, pool, schema, order(1, "c-1"), order(2, "c-2"))
	outboxtest.RequirePublished(t, pool, "orders", in, outboxtest.Key("c-1")) // committed: enough without Sequenced

	for _, times := range []outboxtest.Match{in, outboxtest.Times(1)} { // at least one; exactly one
		f := &fakeTB{}
		outboxtest.RequirePublished(f, pool, "orders", in, outboxtest.Key("c-1"), outboxtest.Sequenced(), times)
		if !f.failed {
			t.Fatal("Sequenced passed for a message no sequencer has numbered")
		}
		for _, want := range []string{`matches key "c-1" and sequenced`, `1 message(s) match all but "sequenced"`, "waiting for a sequencer that has not run", "topic holds 2 message(s)"} {
			if !strings.Contains(f.msg, want) {
				t.Errorf("failure message lacks %q:\n%s", want, f.msg)
			}
		}
	}

	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seq.SequenceAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := outboxtest.RequirePublished(t, pool, "orders", in, outboxtest.Key("c-1"), outboxtest.Sequenced(), outboxtest.Times(1))
	if got[0].UUID != "order-1" || got[0].Seq == 0 {
		t.Fatalf("sequenced: %+v", got)
	}
}

// readModel is the table the consuming tests' handlers keep.
func readModel(t *testing.T, pool *pgxpool.Pool, schema string) string {
	table := schema + ".read_model"
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+table+" (order_id text PRIMARY KEY, customer text, n int NOT NULL DEFAULT 1)"); err != nil {
		t.Fatal(err)
	}
	return table
}

// RunUntilIdle sequences what was committed and delivers all of it in the
// calling goroutine, for both strategies and for batch handlers, and leaves
// no goroutine behind; a second run finds nothing.
func TestRunUntilIdleDeliversEverythingAndLeavesNothingRunning(t *testing.T) {
	for _, tc := range []struct {
		name     string
		strategy outbox.Strategy
		batch    bool
	}{
		{"Leased", outbox.Leased, false},
		{"Transactional", outbox.Transactional, false},
		{"Leased ConsumeBatches", outbox.Leased, true},
		{"Transactional ConsumeBatches", outbox.Transactional, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, schema := env(t)
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			table := readModel(t, pool, schema)
			tx, err := pool.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var msgs []*message.Message
			for i := range 30 {
				msgs = append(msgs, order(i, fmt.Sprintf("c-%d", i%4)))
			}
			publishTx(t, tx, schema, msgs...)
			if err := tx.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			cfg := outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "read-model", Strategy: tc.strategy, Tuning: adaptive.Default()}
			apply := func(ctx context.Context, m *message.Message) error {
				q := "INSERT INTO " + table + " (order_id, customer) VALUES ($1, $2) ON CONFLICT (order_id) DO UPDATE SET n = " + table + ".n + 1"
				if tc.strategy == outbox.Transactional {
					tx, ok := outbox.TxFromContext[pgx.Tx](m.Context())
					if !ok {
						return errors.New("no transaction in the context")
					}
					_, err := tx.Exec(ctx, q, m.UUID, m.Metadata.Get(outbox.PublishPartitionKeyMetadata))
					return err
				}
				_, err := pool.Exec(ctx, q, m.UUID, m.Metadata.Get(outbox.PublishPartitionKeyMetadata))
				return err
			}
			ctx := context.Background()
			var res outboxtest.Result
			if tc.batch {
				r, err := outboxtest.NewBatchRunner(ctx, cfg, "orders", func(ctx context.Context, batch []*message.Message) (int, error) {
					for i, m := range batch {
						if err := apply(ctx, m); err != nil {
							return i, err
						}
					}
					return len(batch), nil
				})
				if err != nil {
					t.Fatal(err)
				}
				res, err = r.RunUntilIdle(ctx)
				if cerr := r.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					t.Fatal(err)
				}
			} else {
				res, err = outboxtest.RunUntilIdle(ctx, cfg, "orders", func(m *message.Message) error { return apply(m.Context(), m) })
				if err != nil {
					t.Fatal(err)
				}
			}
			if res.Acked != 30 || res.Sequenced != 30 || res.Last != outboxtest.Idle || res.Failed+res.Rejected != 0 {
				t.Fatalf("RunUntilIdle: %+v, want 30 sequenced and acked, idle", res)
			}
			var rows, dup int
			if err := pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE n > 1) FROM "+table).Scan(&rows, &dup); err != nil {
				t.Fatal(err)
			}
			if rows != 30 || dup != 0 {
				t.Fatalf("read model: %d rows, %d applied twice", rows, dup)
			}
			// Nothing left: a second run delivers nothing.
			again, err := outboxtest.RunUntilIdle(ctx, cfg, "orders", func(*message.Message) error { return errors.New("must not be called") })
			if err != nil || again.Handled() != 0 || again.Last != outboxtest.Idle {
				t.Fatalf("second run: %+v, %v", again, err)
			}
		})
	}
}

// Tick says what happened: processed, a failure backing off, taken out
// after MaxAttempts, paused, and leased by a running Subscriber.
func TestTickSaysWhatHappened(t *testing.T) {
	pool, schema := env(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	publishTx(t, tx, schema, order(1, "c-1"))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	store, err := deadletter.NewStore(deadletter.Config{Schema: schema, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tu := adaptive.Default()
	tu.BackoffBase, tu.BackoffMax = time.Hour, time.Hour // no retry within the test
	cfg := outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "billing", Tuning: tu, RejectHandler: store, MaxAttempts: 2}
	calls := 0
	errDown, errStillDown := errors.New("the payment service is down"), errors.New("still down")
	r, err := outboxtest.NewRunner(ctx, cfg, "orders", func(*message.Message) error {
		calls++
		return errDown
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	first, err := r.Tick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first.State != outboxtest.Processed || first.Failed != 1 || first.Sequenced != 1 || first.Partitions != 3 || calls != 1 {
		t.Fatalf("first tick: %+v, %d calls", first, calls)
	}
	if !errors.Is(first.HandlerErr, errDown) {
		t.Fatalf("first tick's HandlerErr = %v, want the handler's error %q", first.HandlerErr, errDown)
	}
	second, err := r.Tick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if second.State != outboxtest.BackingOff || second.RetryIn < 30*time.Minute || calls != 1 || second.HandlerErr != nil {
		t.Fatalf("second tick: %+v, %d calls; want backing off for about an hour, no delivery and so no handler error", second, calls)
	}
	// An operator's "retry now": pause and resume (outbox pause / resume,
	// the console) ends the backoff, and the second failure is the last
	// one allowed (MaxAttempts 2): a dead letter.
	r.Close()
	adm, err := admin.New(admin.Config{Schema: schema, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []func(context.Context, admin.Scope) (int, error){adm.Pause, adm.Resume} {
		if _, err := op(ctx, admin.Scope{Group: "billing", Topic: "orders"}); err != nil {
			t.Fatal(err)
		}
	}
	r, err = outboxtest.NewRunner(ctx, cfg, "orders", func(*message.Message) error { calls++; return errStillDown })
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RunUntilIdle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Rejected != 1 || res.Last != outboxtest.Idle || calls != 2 || !errors.Is(res.HandlerErr, errStillDown) {
		t.Fatalf("after the retry: %+v, %d calls; want rejected with the handler's error, then idle", res, calls)
	}
	if n, err := store.Count(ctx, deadletter.Filter{}); err != nil || n != 1 {
		t.Fatalf("dead letters: %d, %v", n, err)
	}
	r.Close()

	// Paused by an operator.
	if _, err := adm.Pause(ctx, admin.Scope{Group: "billing", Topic: "orders"}); err != nil {
		t.Fatal(err)
	}
	paused, err := outboxtest.RunUntilIdle(ctx, cfg, "orders", func(*message.Message) error { return nil })
	if err != nil || paused.Last != outboxtest.Paused {
		t.Fatalf("paused group: %+v, %v", paused, err)
	}

	// Leased by a running Subscriber of another group member.
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "audit"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := sub.Subscribe(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	auditCfg := outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "audit"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := outboxtest.RunUntilIdle(ctx, auditCfg, "orders", func(*message.Message) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		if got.Last == outboxtest.LeasedByAnother {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with a running Subscriber holding the group's partitions: %+v", got)
		}
		time.Sleep(20 * time.Millisecond) // the Subscriber takes its leases in the background
	}
}

// A forwarder's handler, driven synchronously: everything committed is
// handed to the Target by the time RunUntilIdle returns.
func TestBatchRunnerDrivesABatchHandler(t *testing.T) {
	pool, schema := env(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	publishTx(t, tx, schema, order(1, "a"), order(2, "b"), order(3, "a"))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var sent []string
	r, err := outboxtest.NewBatchRunner(ctx, outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "fwd"}, "orders",
		func(_ context.Context, batch []*message.Message) (int, error) {
			for _, m := range batch {
				sent = append(sent, m.UUID)
			}
			return len(batch), nil
		})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	res, err := r.RunUntilIdle(ctx)
	if err != nil || res.Acked != 3 || len(sent) != 3 {
		t.Fatalf("%+v, %v; sent %v", res, err, sent)
	}
}

// Schema's schema is migrated and gone after the test.
func TestSchemaIsMigratedAndDroppedAtCleanup(t *testing.T) {
	pool := pgtest.Pool(t)
	var name string
	t.Run("inner", func(t *testing.T) {
		name = outboxtest.Schema(t, pool)
		if v, err := outbox.CurrentSchemaVersion(context.Background(), pool, name); err != nil || v != outbox.SchemaVersion {
			t.Fatalf("schema %s at version %d (%v), want %d", name, v, err, outbox.SchemaVersion)
		}
	})
	var exists bool
	if err := pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("schema %s still exists after its test", name)
	}
}

// A closed Runner refuses Tick and RunUntilIdle with an error matching
// outbox.ErrClosed, as every closed component of the outbox does; closing
// it again is a no-op. A Runner not made by NewRunner is
// outbox.ErrInvalidArgument, not a panic.
func TestClosedRunnerIsErrClosed(t *testing.T) {
	pool, schema := env(t)
	ctx := context.Background()
	r, err := outboxtest.NewRunner(ctx, outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "billing"}, "orders",
		func(*message.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := r.Tick(ctx); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("Tick after Close: %v, want ErrClosed", err)
	}
	if _, err := r.RunUntilIdle(ctx); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("RunUntilIdle after Close: %v, want ErrClosed", err)
	}
	var zero outboxtest.Runner
	if _, err := zero.Tick(ctx); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("Tick of a zero Runner: %v, want ErrInvalidArgument", err)
	}
	if err := zero.Close(); err != nil {
		t.Errorf("Close of a zero Runner: %v", err)
	}
}

// The Require functions fail the test, with a message, on a nil match or a
// match built on a nil func, and say so when the schema is not migrated.
func TestRequireRefusesNilMatchesAndUnmigratedSchemas(t *testing.T) {
	pool, schema := env(t)
	for _, c := range []struct {
		name  string
		match []outboxtest.Match
		want  string
	}{
		{"nil match", []outboxtest.Match{outboxtest.InSchema(schema), nil}, "match 1 (0-based) is nil"},
		{"Where nil", []outboxtest.Match{outboxtest.InSchema(schema), outboxtest.Where("paid", nil)}, "the match on paid has a nil func"},
		{"Payload nil", []outboxtest.Match{outboxtest.InSchema(schema), outboxtest.Payload("is JSON", nil)}, "the match on payload is JSON has a nil func"},
		{"unmigrated schema", []outboxtest.Match{outboxtest.InSchema(schema + "_none")}, "is not migrated"},
	} {
		tb := &fakeTB{}
		done := make(chan struct{})
		go func() { // Fatalf of a real test ends the goroutine: so does the fake's caller here
			defer close(done)
			outboxtest.RequirePublished(tb, pool, "orders", c.match...)
		}()
		<-done
		if !tb.failed || !strings.Contains(tb.msg, c.want) {
			t.Errorf("%s: failed %v with %q, want a failure saying %q", c.name, tb.failed, tb.msg, c.want)
		}
	}
}

// A test of a delayed message does not wait for it: Advance moves the
// runner's clock, and its sequencer takes the message as due.
func TestRunnerAdvanceDeliversDelayedMessages(t *testing.T) {
	pool, schema := env(t)
	delayedOrder := order(1, "c")
	if err := outbox.DeliverAfter(delayedOrder, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	publishTx(t, tx, schema, order(0, "c"), delayedOrder, order(2, "c"))
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got []string
	r, err := outboxtest.NewRunner(context.Background(), outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "g"}, "orders",
		func(m *message.Message) error { got = append(got, m.UUID); return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.RunUntilIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("delivered before the day passed: %v, want only the first order (the third waits behind the delayed one)", got)
	}
	r.Advance(25 * time.Hour)
	if _, err := r.RunUntilIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := []string{order(0, "c").UUID, delayedOrder.UUID, order(2, "c").UUID}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}

// RunTopicsUntilIdle follows work across topics in one call: each order's
// handler publishes a shipment, whose handler runs before the call returns.
func TestRunTopicsUntilIdleFollowsWorkAcrossTopics(t *testing.T) {
	pool, schema := env(t)
	ctx := context.Background()
	if err := outbox.RegisterTopic(ctx, pool, schema, "shipments", 2); err != nil {
		t.Fatal(err)
	}
	publishCommitted(t, pool, schema, order(1, "a"), order(2, "b"), order(3, "a"))
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var shipped []string
	res, err := outboxtest.RunTopicsUntilIdle(ctx, outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "fulfilment"},
		map[string]outboxtest.Handler{
			"orders": func(m *message.Message) error {
				return pub.Publish("shipments", message.NewMessage("ship-"+m.UUID, nil))
			},
			"shipments": func(m *message.Message) error {
				shipped = append(shipped, m.UUID)
				return nil
			},
		})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(shipped)
	if res["orders"].Acked != 3 || res["shipments"].Acked != 3 || !slices.Equal(shipped, []string{"ship-order-1", "ship-order-2", "ship-order-3"}) {
		t.Fatalf("results %+v, shipped %v; want 3 orders and their 3 shipments handled", res, shipped)
	}
	if _, err := outboxtest.RunTopicsUntilIdle(ctx, outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "x"},
		map[string]outboxtest.Handler{"orders": nil}); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("a nil handler: %v, want ErrInvalidArgument", err)
	}
}
