package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// The failure modes of issue 10: each ends in a counted attempt, a visible
// state and, after MaxAttempts, a dead letter, never in a silent stall.

// publishPayloads publishes one message per payload to topic (one
// partition, so they are delivered in this order), uuid "m<i>".
func publishPayloads(t *testing.T, e env, topic string, payloads ...string) {
	t.Helper()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range payloads {
		if err := pub.Publish(topic, message.NewMessage(fmt.Sprintf("m%d", i+1), []byte(p))); err != nil {
			t.Fatal(err)
		}
	}
}

// cursorRow reads the group's cursor row of partition 0.
type cursorRow struct {
	seq, attempts, deliveries int64
	lastError                 string
	backoffUntil              *time.Time
}

func (e env) cursor(t *testing.T, group, topic string) cursorRow {
	t.Helper()
	var c cursorRow
	err := e.Pool.QueryRow(context.Background(), `SELECT seq, attempts, deliveries, coalesce(last_error, ''), backoff_until
		FROM `+e.Schema+`.cursors WHERE group_name = $1 AND topic = $2 AND partition = 0`, group, topic).
		Scan(&c.seq, &c.attempts, &c.deliveries, &c.lastError, &c.backoffUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return cursorRow{} // the group has not joined yet
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// effectIDs reads the ids of an effects table, in order.
func (e env) effectIDs(t *testing.T, table string) []string {
	t.Helper()
	rows, err := e.Pool.Query(outboxtest.Ctx(t), "SELECT id FROM "+table+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// pgxTxFrom returns the Transactional strategy's transaction of a message
// context.
func pgxTxFrom(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := outbox.TxFromContext[any](ctx)
	if !ok {
		return nil, false
	}
	ptx, ok := tx.(pgx.Tx)
	return ptx, ok
}

func rejectedUUIDs(got []outboxtype.RejectedMessage) []string {
	var ids []string
	for _, m := range got {
		ids = append(ids, m.UUID)
	}
	return ids
}

// Failure mode 1: a Transactional handler that swallows a failed statement
// (or ends the transaction itself) and acks.
func TestTransactionalHandlerThatBreaksItsTransactionIsACountedAttempt(t *testing.T) {
	t.Parallel()
	cases := map[string]func(ctx context.Context, tx pgx.Tx, effects string, id string){
		// The usual idempotency check: the insert fails with a unique
		// violation, the handler ignores it and acks.
		"swallowed unique violation": func(ctx context.Context, tx pgx.Tx, effects, id string) {
			_, _ = tx.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1)", "taken")
		},
		"Commit": func(ctx context.Context, tx pgx.Tx, _, _ string) { _ = tx.Commit(ctx) },
		"Rollback": func(ctx context.Context, tx pgx.Tx, _, _ string) {
			_ = tx.Rollback(ctx)
		},
	}
	for name, misbehave := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.Register("orders", 1)
			effects := e.Schema + ".effects"
			if _, err := e.Pool.Exec(outboxtest.Ctx(t), "CREATE TABLE "+effects+" (id text PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			if _, err := e.Pool.Exec(outboxtest.Ctx(t), "INSERT INTO "+effects+" VALUES ('taken')"); err != nil {
				t.Fatal(err)
			}
			publishPayloads(t, e, "orders", "ok", "bad", "ok")
			rejects, rejected := rejectLog(t, e)
			sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) {
				c.Strategy = outbox.Transactional
				c.RejectHandler = rejects
				c.MaxAttempts = 3
			})
			defer sub.Close()
			msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
			if err != nil {
				t.Fatal(err)
			}
			var deliveries atomic.Int32
			go func() {
				for m := range msgs {
					deliveries.Add(1)
					tx, _ := outbox.TxFromContext[any](m.Context())
					ptx := tx.(pgx.Tx)
					if _, err := ptx.Exec(m.Context(), "INSERT INTO "+effects+" VALUES ($1)", m.UUID); err != nil {
						t.Errorf("effect of %s: %v", m.UUID, err)
					}
					if string(m.Payload) == "bad" {
						misbehave(m.Context(), ptx, effects, m.UUID)
					}
					m.Ack()
				}
			}()
			outboxtest.WaitFor(t, "the cursor past every message", 30*time.Second, func() bool { return e.cursor(t, "g", "orders").seq == 3 })
			got := rejected()
			if len(got) != 1 || got[0].UUID != "m2" {
				t.Fatalf("rejected %v, want [m2]", rejectedUUIDs(got))
			}
			if got[0].Attempts != 3 || !errors.Is(got[0].Reason, outbox.ErrPoison) || !errors.Is(got[0].Reason, outbox.ErrTxMisuse) {
				t.Fatalf("rejection: attempts %d, reason %v; want 3 attempts and ErrTxMisuse", got[0].Attempts, got[0].Reason)
			}
			if n := deliveries.Load(); n != 5 {
				t.Fatalf("%d deliveries, want 5 (m1, m2 three times, m3)", n)
			}
			if ids := e.effectIDs(t, effects); strings.Join(ids, ",") != "m1,m3,taken" {
				t.Fatalf("effects %v: want m1, m3 (m2's undone with its savepoint)", ids)
			}
		})
	}
}

// The failure before the dead letter is visible on the cursor row.
func TestTransactionalMisuseIsRecordedOnTheCursor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	publishPayloads(t, e, "orders", "bad")
	sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) {
		c.Strategy = outbox.Transactional
		c.Tuning.BackoffBase = time.Hour // one failure, then wait
		c.Tuning.BackoffMax = time.Hour
	})
	defer sub.Close()
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			tx, _ := pgxTxFrom(m.Context())
			_, _ = tx.Exec(m.Context(), "SELECT 1/0") // fails, aborts the transaction
			m.Ack()
		}
	}()
	outboxtest.WaitFor(t, "a recorded failure", 30*time.Second, func() bool { return e.cursor(t, "g", "orders").attempts == 1 })
	c := e.cursor(t, "g", "orders")
	if c.seq != 0 || !strings.Contains(c.lastError, "aborts the whole transaction") || c.backoffUntil == nil {
		t.Fatalf("cursor %+v: want seq 0, a last error saying what the handler did, and a backoff deadline", c)
	}
}

// hangingConsumer handles each message on a goroutine of its own, as a
// Watermill Router does; a message whose payload is "hang" blocks until
// release is closed, then acks (a late answer).
func hangingConsumer(t *testing.T, msgs <-chan *message.Message, release <-chan struct{}, effects string) *atomic.Int32 {
	var hung atomic.Int32
	go func() {
		for m := range msgs {
			go func(m *message.Message) {
				if tx, ok := pgxTxFrom(m.Context()); ok && effects != "" {
					if _, err := tx.Exec(context.Background(), "INSERT INTO "+effects+" VALUES ($1) ON CONFLICT DO NOTHING", m.UUID); err != nil {
						t.Errorf("effect: %v", err)
					}
				}
				if string(m.Payload) == "hang" {
					hung.Add(1)
					<-release
					if tx, ok := pgxTxFrom(m.Context()); ok && effects != "" {
						// The late handler's writes must not land anywhere.
						_, _ = tx.Exec(context.Background(), "INSERT INTO "+effects+" VALUES ('late')")
					}
				}
				m.Ack()
			}(m)
		}
	}()
	return &hung
}

// Failure mode 2: a handler that never returns.
func TestHungHandlerIsACountedAttemptAndItsLateAckChangesNothing(t *testing.T) {
	t.Parallel()
	for _, strategy := range []outbox.Strategy{outbox.Leased, outbox.Transactional} {
		t.Run(strategy.String(), func(t *testing.T) {
			e := newEnv(t)
			e.Register("orders", 1)
			effects := ""
			if strategy == outbox.Transactional {
				effects = e.Schema + ".effects"
				if _, err := e.Pool.Exec(outboxtest.Ctx(t), "CREATE TABLE "+effects+" (id text PRIMARY KEY)"); err != nil {
					t.Fatal(err)
				}
			}
			publishPayloads(t, e, "orders", "ok", "hang", "ok")
			rejects, rejected := rejectLog(t, e)
			sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) {
				c.Strategy = strategy
				c.RejectHandler = rejects
				c.MaxAttempts = 2
				c.HandlerTimeout = 300 * time.Millisecond
			})
			msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
			if err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			hung := hangingConsumer(t, msgs, release, effects)
			outboxtest.WaitFor(t, "the cursor past every message", 30*time.Second, func() bool { return e.cursor(t, "g", "orders").seq == 3 })
			got := rejected()
			if len(got) != 1 || got[0].UUID != "m2" || got[0].Attempts != 2 || !errors.Is(got[0].Reason, outbox.ErrHandlerTimeout) {
				t.Fatalf("rejected %+v: want m2 after 2 attempts with ErrHandlerTimeout", got)
			}
			// Leased: both timeouts are charged. Transactional: the first
			// one, behind m1 in its batch, gives the transaction up; m1 is
			// committed alone next, and m2, now the head, is charged from
			// its next delivery on.
			want := int32(2)
			if strategy == outbox.Transactional {
				want = 3
			}
			if n := hung.Load(); n != want {
				t.Fatalf("the hanging message was delivered %d times, want %d", n, want)
			}
			close(release) // the late answers
			time.Sleep(300 * time.Millisecond)
			if c := e.cursor(t, "g", "orders"); c.seq != 3 || c.attempts != 0 {
				t.Fatalf("cursor after the late acks: %+v", c)
			}
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			if effects != "" {
				if ids := e.effectIDs(t, effects); strings.Join(ids, ",") != "m1,m3" {
					t.Fatalf("effects %v, want m1,m3: the timed-out deliveries' writes must be rolled back", ids)
				}
			}
		})
	}
}

// Failure mode 2 for ConsumeBatches: the handler of a batch that hangs is
// timed out; the batch is retried one message at a time, so the message
// that hangs is the one charged.
func TestHungBatchHandlerIsTimedOutAndTheHangingMessageCharged(t *testing.T) {
	t.Parallel()
	for _, strategy := range []outbox.Strategy{outbox.Leased, outbox.Transactional} {
		t.Run(strategy.String(), func(t *testing.T) {
			e := newEnv(t)
			e.Register("orders", 1)
			publishPayloads(t, e, "orders", "ok", "hang", "ok", "ok")
			rejects, rejected := rejectLog(t, e)
			sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) {
				c.Strategy = strategy
				c.RejectHandler = rejects
				c.MaxAttempts = 2
				c.HandlerTimeout = 300 * time.Millisecond
			})
			defer sub.Close()
			release := make(chan struct{})
			defer close(release)
			var calls atomic.Int32
			go func() {
				_ = sub.ConsumeBatches(outboxtest.Ctx(t), "orders", func(ctx context.Context, batch []*message.Message) (int, error) {
					calls.Add(1)
					for _, m := range batch {
						if string(m.Payload) == "hang" {
							<-release
						}
					}
					return len(batch), nil
				})
			}()
			outboxtest.WaitFor(t, "the cursor past every message", 30*time.Second, func() bool { return e.cursor(t, "g", "orders").seq == 4 })
			got := rejected()
			if len(got) != 1 || got[0].UUID != "m2" || !errors.Is(got[0].Reason, outbox.ErrHandlerTimeout) {
				t.Fatalf("rejected %+v: want only m2, with ErrHandlerTimeout", got)
			}
		})
	}
}

// Failure mode 3: a message that makes its consumer process exit. The
// test binary runs itself as the consumer (TestCrashingConsumerChild) and
// restarts it after every crash, until the message is dead-lettered.
func TestMessageThatCrashesTheProcessIsDeadLetteredAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	if os.Getenv("OUTBOX_CRASH_CHILD") != "" {
		t.Skip("running as the child")
	}
	e := newEnv(t)
	e.Register("orders", 1)
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "CREATE TABLE "+e.Schema+".effects (id text, pid int)"); err != nil {
		t.Fatal(err)
	}
	publishPayloads(t, e, "orders", "ok", "crash", "ok")
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "CREATE TABLE "+e.Schema+".rejects (uuid text PRIMARY KEY, seq bigint, attempts int, reason text)"); err != nil {
		t.Fatal(err)
	}
	const maxAttempts = 3
	crashes := 0
	for run := 0; ; run++ {
		if run > 2*maxAttempts+2 {
			t.Fatalf("still crashing after %d runs: the crashes are not counted", run)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashingConsumerChild$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			"OUTBOX_CRASH_CHILD=1",
			pgtest.EnvDatabaseURL+"="+pgtest.DatabaseURL(),
			"OUTBOX_CRASH_SCHEMA="+e.Schema,
			fmt.Sprintf("OUTBOX_CRASH_MAX_ATTEMPTS=%d", maxAttempts))
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var err error
		select {
		case err = <-exited:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("the child neither crashed nor finished:\n%s", out.String())
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 3 {
			crashes++
			continue
		}
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out.String())
		}
		break // the child saw every message done
	}
	var attempts int
	var reason string
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT attempts, reason FROM "+e.Schema+".rejects WHERE uuid = 'm2'").Scan(&attempts, &reason); err != nil {
		t.Fatalf("the crashing message was not dead-lettered: %v", err)
	}
	if attempts != maxAttempts || !strings.Contains(reason, "without success") {
		t.Fatalf("dead letter: attempts %d, reason %q; want %d (the counted deliveries) and a reason naming them", attempts, reason, maxAttempts)
	}
	// The first crash is charged to the head of its batch (m1, acked but
	// not yet past the cursor): one crash more than MaxAttempts at most.
	if crashes < maxAttempts || crashes > maxAttempts+1 {
		t.Fatalf("%d crashes, want %d or %d", crashes, maxAttempts, maxAttempts+1)
	}
	var m3 int
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT count(*) FROM "+e.Schema+".effects WHERE id = 'm3'").Scan(&m3); err != nil || m3 == 0 {
		t.Fatalf("m3 was never handled (%v): the partition stalled", err)
	}
	t.Logf("%d crashes, dead letter after %d attempts: %s", crashes, attempts, reason)
}

// TestCrashingConsumerChild is the consumer process of the test above: it
// exits with status 3 when it is handed the "crash" message, and with 0
// once the cursor is past every message.
func TestCrashingConsumerChild(t *testing.T) {
	t.Parallel()
	if os.Getenv("OUTBOX_CRASH_CHILD") == "" {
		t.Skip("only runs as the child of TestMessageThatCrashesTheProcessIsDeadLetteredAfterMaxAttempts")
	}
	schema := os.Getenv("OUTBOX_CRASH_SCHEMA")
	var maxAttempts int
	fmt.Sscan(os.Getenv("OUTBOX_CRASH_MAX_ATTEMPTS"), &maxAttempts)
	pool := pgtest.Pool(t)
	e := env{outboxtest.Attach(t, pool, schema)}
	rejects := outboxtype.RejectHandlerFunc(func(c context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
		_, err := tx.Exec(c, "INSERT INTO "+schema+".rejects VALUES ($1, $2, $3, $4)", m.UUID, m.Seq, m.Attempts, m.Reason.Error())
		return err
	})
	tu := outboxtest.FastTuning()
	tu.LeaseTTL = time.Second
	tu.BackoffBase, tu.BackoffMax = 10*time.Millisecond, 10*time.Millisecond
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
		Schema: schema, Pool: pool, ConsumerGroup: "g", Tuning: tu, Advanced: outboxtest.FastAdvanced(),
		RejectHandler: rejects, MaxAttempts: maxAttempts,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(context.Background(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			if string(m.Payload) == "crash" {
				os.Exit(3) // no deferred call, no Nack: as a crash
			}
			if _, err := pool.Exec(context.Background(), "INSERT INTO "+schema+".effects VALUES ($1, $2)", m.UUID, os.Getpid()); err != nil {
				m.Nack()
				continue
			}
			m.Ack()
		}
	}()
	outboxtest.WaitFor(t, "the cursor past every message", 50*time.Second, func() bool { return e.cursor(t, "g", "orders").seq == 3 })
	_ = sub.Close()
}

// Failure mode 7: the backoff is kept on the cursor row and honoured by the
// next holder of the lease.
func TestBackoffSurvivesARestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	publishPayloads(t, e, "orders", "fail")
	tune := func(c *outbox.SubscriberConfig) {
		c.Tuning.BackoffBase, c.Tuning.BackoffMax = 3*time.Second, 3*time.Second
	}
	first := newSub(t, e, "g", tune)
	msgs, err := first.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			m.Nack()
		}
	}()
	outboxtest.WaitFor(t, "a recorded failure", 30*time.Second, func() bool { return e.cursor(t, "g", "orders").attempts == 1 })
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	c := e.cursor(t, "g", "orders")
	if c.backoffUntil == nil {
		t.Fatal("no backoff_until on the cursor row")
	}
	var secs float64
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT extract(epoch FROM $1::timestamptz - clock_timestamp())::float8", c.backoffUntil).Scan(&secs); err != nil {
		t.Fatal(err)
	}
	untilIn := time.Duration(secs * float64(time.Second))
	if untilIn < time.Second {
		t.Fatalf("backoff left %v: the jittered backoff is at least 1.5s", untilIn)
	}
	// A new instance takes the released lease at once, but must not retry
	// before the recorded deadline.
	second := newSub(t, e, "g", tune)
	defer second.Close()
	started := time.Now()
	msgs2, err := second.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs2:
		if waited := time.Since(started); waited < untilIn-200*time.Millisecond {
			t.Fatalf("retried after %v, before the backoff deadline (%v left)", waited, untilIn)
		}
		if m.Metadata.Get(outbox.MetadataAttempt) != "2" {
			t.Fatalf("attempt %s, want 2", m.Metadata.Get(outbox.MetadataAttempt))
		}
		m.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("no retry")
	}
}

// Bad input: a Subscriber on a schema Migrate never ran on, or one a newer
// release migrated, is refused with a typed error at Subscribe.
func TestSubscribeRefusesAnUnmigratedOrNewerSchema(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	fresh := pgtest.Schema(t)
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Schema: fresh, Pool: pool, ConsumerGroup: "g"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var nm *outboxtype.NotMigratedError
	if _, err := sub.Subscribe(outboxtest.Ctx(t), "orders"); !errors.Is(err, outbox.ErrNotMigrated) || !errors.As(err, &nm) || !strings.Contains(err.Error(), "outbox.Migrate") {
		t.Fatalf("Subscribe on an unmigrated schema: %v, want ErrNotMigrated naming outbox.Migrate", err)
	}
	if err := sub.SubscribeInitialize("orders"); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("SubscribeInitialize on an unmigrated schema: %v, want ErrNotMigrated", err)
	}

	e := newEnv(t)
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "INSERT INTO "+e.Schema+".schema_migrations (version, name) VALUES ($1, 'future')", outbox.SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	newer := newSub(t, e, "g", nil)
	defer newer.Close()
	if _, err := newer.Subscribe(outboxtest.Ctx(t), "orders"); !errors.Is(err, outbox.ErrSchemaTooNew) {
		t.Fatalf("Subscribe on a newer schema: %v, want ErrSchemaTooNew", err)
	}
	if n := e.Rows("cursors"); n != 0 {
		t.Fatalf("%d cursor rows written into a newer schema", n)
	}
}

// A Subscribe that failed (the schema was not migrated yet) does not keep
// a later, successful one from starting the Subscriber's own sequencer.
func TestSubscribeAfterAFailedOneStartsTheSequencer(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Schema: schema, Pool: pool, ConsumerGroup: "g", Tuning: outboxtest.FastTuning(), Advanced: outboxtest.FastAdvanced()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := sub.Subscribe(outboxtest.Ctx(t), "orders"); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("Subscribe before Migrate: %v", err)
	}
	if err := outbox.Migrate(outboxtest.Ctx(t), pool, schema); err != nil {
		t.Fatal(err)
	}
	if err := outbox.RegisterTopic(outboxtest.Ctx(t), pool, schema, "orders", 1); err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage("m1", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		m.Ack()
	case <-time.After(20 * time.Second):
		t.Fatal("not delivered: nothing sequences the message")
	}
}

// A lost connection in the middle of a Transactional batch is a database
// failure, not the handler's: no attempt is charged (with MaxAttempts 1 a
// charged one would dead-letter the message), and the batch is retried.
func TestLostConnectionIsNotChargedToTheMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	publishPayloads(t, e, "orders", "ok", "ok")
	rejects, rejected := rejectLog(t, e)
	sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) {
		c.Strategy = outbox.Transactional
		c.RejectHandler = rejects
		c.MaxAttempts = 1
	})
	defer sub.Close()
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	var killed atomic.Bool
	go func() {
		for m := range msgs {
			tx, _ := pgxTxFrom(m.Context())
			if m.UUID == "m1" && killed.CompareAndSwap(false, true) {
				// The server drops the batch's connection; the handler acks.
				if _, err := e.Pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", tx.Conn().PgConn().PID()); err != nil {
					t.Error(err)
				}
			}
			m.Ack()
		}
	}()
	outboxtest.WaitFor(t, "the cursor past both messages", 30*time.Second, func() bool { return e.cursor(t, "g", "orders").seq == 2 })
	if got := rejected(); len(got) != 0 {
		t.Fatalf("rejected %v: the lost connection was charged to the message", rejectedUUIDs(got))
	}
	if !killed.Load() {
		t.Fatal("the connection was never killed")
	}
}
