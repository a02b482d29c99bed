package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// Bad inputs of issue 10: each gets a typed error, never a panic or a
// quiet write.

func TestPublishOfNilMessagesIsATypedError(t *testing.T) {
	e := newEnv(t)
	e.register(t, "orders", 1)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.schema, DB: e.pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, msgs := range map[string][]*message.Message{
		"nil":          {nil},
		"m, nil":       {message.NewMessage("m", []byte("x")), nil},
		"nil, m, nil,": {nil, message.NewMessage("m", []byte("x"))},
	} {
		var me *outbox.MessageError
		if err := pub.Publish("orders", msgs...); !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) {
			t.Fatalf("Publish(%s) = %v, want ErrInvalidMessage", name, err)
		}
	}
	if n := e.count(t, "pending"); n != 0 {
		t.Fatalf("%d rows written", n)
	}
}

// A handle that is not a transaction would write the message on its own,
// and it would survive the caller's rollback.
func TestWithTxRefusesHandlesThatAreNotTransactions(t *testing.T) {
	e := newEnv(t)
	e.register(t, "orders", 1)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.DB(t)
	conn, err := e.pool.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	sqlConn, err := db.Conn(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer sqlConn.Close()
	for name, handle := range map[string]any{
		"*pgxpool.Pool":                 e.pool,
		"*sql.DB":                       db,
		"*sql.Conn":                     sqlConn,
		"*pgx.Conn outside transaction": conn.Conn(),
	} {
		m := message.NewMessage("m", []byte("x"))
		m.SetContext(outbox.WithTx(ctx(t), handle))
		var nt *outbox.NotInTxError
		if err := pub.Publish("orders", m); !errors.Is(err, outbox.ErrNotInTx) || !errors.As(err, &nt) {
			t.Fatalf("%s: Publish = %v, want ErrNotInTx", name, err)
		}
		if _, err := outbox.NewTxPublisher(handle, outbox.PublisherConfig{Schema: e.schema}, nil); !errors.Is(err, outbox.ErrNotInTx) && name != "*pgx.Conn outside transaction" {
			t.Fatalf("%s: NewTxPublisher = %v, want ErrNotInTx", name, err)
		}
	}
	if n := e.count(t, "pending"); n != 0 {
		t.Fatalf("%d rows written outside any transaction", n)
	}
	// A *pgx.Conn inside a transaction it began is one: the message goes
	// with its rollback.
	if _, err := conn.Exec(ctx(t), "BEGIN"); err != nil {
		t.Fatal(err)
	}
	m := message.NewMessage("in-tx", []byte("x"))
	m.SetContext(outbox.WithTx(ctx(t), conn.Conn()))
	if err := pub.Publish("orders", m); err != nil {
		t.Fatalf("Publish on a connection in a transaction: %v", err)
	}
	if _, err := conn.Exec(ctx(t), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, "pending"); n != 0 {
		t.Fatalf("%d rows survived the rollback", n)
	}
}

func TestEveryEntryPointRefusesAnUnmigratedSchema(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	msg := func() *message.Message { return message.NewMessage("m", []byte("x")) }
	cases := map[string]func() error{
		"RegisterTopic": func() error { return outbox.RegisterTopic(ctx(t), pool, schema, "orders", 1) },
		"TopicPartitions": func() error {
			_, err := outbox.TopicPartitions(ctx(t), pool, schema, "orders")
			return err
		},
		"Publish (OwnTransaction)": func() error {
			pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: pool, OwnTransaction: true, AutoCreateTopics: true}, nil)
			if err != nil {
				return err
			}
			return pub.Publish("orders", msg())
		},
		"Publish (caller's transaction)": func() error {
			tx, err := pool.Begin(ctx(t))
			if err != nil {
				return err
			}
			defer tx.Rollback(context.Background())
			pub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
			if err != nil {
				return err
			}
			err = pub.Publish("orders", msg())
			// The check must not have aborted the caller's transaction.
			if _, qerr := tx.Exec(ctx(t), "SELECT 1"); qerr != nil {
				t.Errorf("the caller's transaction was aborted: %v", qerr)
			}
			return err
		},
		"Sequencer.SequenceAll": func() error {
			seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: pool}, nil)
			if err != nil {
				return err
			}
			_, err = seq.SequenceAll(ctx(t))
			return err
		},
		"Sequencer.Run": func() error {
			seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: pool}, nil)
			if err != nil {
				return err
			}
			c, cancel := context.WithTimeout(ctx(t), 10*time.Second)
			defer cancel()
			return seq.Run(c)
		},
	}
	for name, run := range cases {
		err := run()
		var nm *outbox.NotMigratedError
		if !errors.Is(err, outbox.ErrNotMigrated) || !errors.As(err, &nm) || !strings.Contains(err.Error(), "outbox.Migrate") {
			t.Errorf("%s: %v, want ErrNotMigrated naming outbox.Migrate", name, err)
		}
	}
}

func TestWritersRefuseASchemaMigratedByANewerRelease(t *testing.T) {
	e := newEnv(t)
	e.register(t, "orders", 1)
	pool := pgtest.Pool(t) // a pool whose schema check is not cached yet
	if _, err := e.pool.Exec(ctx(t), "INSERT INTO "+e.schema+".schema_migrations (version, name) VALUES ($1, 'future')", outbox.SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.schema, DB: pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage("m", []byte("x"))); !errors.Is(err, outbox.ErrSchemaTooNew) {
		t.Fatalf("Publish: %v, want ErrSchemaTooNew", err)
	}
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.schema, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seq.SequenceAll(ctx(t)); !errors.Is(err, outbox.ErrSchemaTooNew) {
		t.Fatalf("SequenceAll: %v, want ErrSchemaTooNew", err)
	}
	if err := outbox.RegisterTopic(ctx(t), pool, e.schema, "other", 1); !errors.Is(err, outbox.ErrSchemaTooNew) {
		t.Fatalf("RegisterTopic: %v, want ErrSchemaTooNew", err)
	}
	if n := e.count(t, "pending") + e.count(t, "topics"); n != 1 {
		t.Fatalf("rows written into a newer schema (pending + topics = %d, want the 1 topic)", n)
	}
}

// Concurrent Migrate calls on a schema that was dropped earlier, with a
// version lookup first on the same pool, used to fail with a unique
// violation on pg_namespace now and then.
func TestConcurrentMigrateOfADroppedSchemaNeverFails(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	for round := 0; round < 30; round++ {
		if _, err := pool.Exec(ctx(t), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.CurrentSchemaVersion(ctx(t), pool, schema); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := outbox.Migrate(ctx(t), pool, schema); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: concurrent Migrate: %v", round, err)
		}
	}
}

func TestMigrateRefusesSystemSchemas(t *testing.T) {
	pool := pgtest.Pool(t)
	for _, schema := range []string{"information_schema", "pg_catalog", "pg_toast", "pg_mine"} {
		if err := outbox.Migrate(ctx(t), pool, schema); !errors.Is(err, outbox.ErrInvalidName) {
			t.Fatalf("Migrate(%q) = %v, want ErrInvalidName", schema, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx(t), "SELECT count(*) FROM pg_tables WHERE schemaname = 'information_schema' AND tablename IN ('pending', 'log', 'topics')").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d outbox tables in information_schema (%v)", n, err)
	}
}

func TestPublishLimitsMetadataAndTheCallsSize(t *testing.T) {
	e := newEnv(t)
	e.register(t, "orders", 1)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.schema, DB: e.pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	huge := message.NewMessage("huge-metadata", []byte("x"))
	huge.Metadata.Set("blob", strings.Repeat("m", 50<<20)) // 50 MB under a 1 MiB payload limit
	var le *outbox.LimitError
	if err := pub.Publish("orders", huge); !errors.Is(err, outbox.ErrMetadataTooLarge) || !errors.As(err, &le) || le.UUID != "huge-metadata" {
		t.Fatalf("50 MB of metadata: %v, want ErrMetadataTooLarge", err)
	}
	// Each message within MaxPayloadBytes, the call over MaxPublishBytes:
	// refused before anything is sent.
	big, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.schema, DB: e.pool, OwnTransaction: true,
		MaxPayloadBytes: 8 << 20, MaxPublishBytes: 16 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*message.Message
	for i := range 3 {
		msgs = append(msgs, message.NewMessage(fmt.Sprint("big-", i), make([]byte, 7<<20)))
	}
	start := time.Now()
	if err := big.Publish("orders", msgs...); !errors.Is(err, outbox.ErrPublishTooLarge) || !errors.As(err, &le) {
		t.Fatalf("3 × 7 MiB in one call: %v, want ErrPublishTooLarge", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the refusal took %v: it must come before sending", took)
	}
	if err := big.Publish("orders", msgs[:2]...); err != nil {
		t.Fatalf("2 × 7 MiB within 16 MiB: %v", err)
	}
	if n := e.count(t, "pending"); n != 2 {
		t.Fatalf("%d rows, want the 2 of the accepted call", n)
	}
	for _, bad := range []outbox.PublisherConfig{
		{Schema: e.schema, MaxMetadataBytes: -1},
		{Schema: e.schema, MaxPayloadBytes: 8 << 20, MaxPublishBytes: 4 << 20},
		{Schema: e.schema, MaxPublishBytes: 2 << 30},
	} {
		if err := bad.Validate(); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Fatalf("Validate(%+v) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}

func TestTypedTransactionAccessors(t *testing.T) {
	pool := pgtest.Pool(t)
	tx, err := pool.Begin(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	c := outbox.WithTx(context.Background(), tx)
	if got, ok := outbox.PgxTxFromContext(c); !ok || got != pgx.Tx(tx) {
		t.Fatalf("PgxTxFromContext = %v, %v", got, ok)
	}
	if _, ok := outbox.SQLTxFromContext(c); ok {
		t.Fatal("SQLTxFromContext found a *sql.Tx in a pgx context")
	}
	stx, err := pgtest.DB(t).BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stx.Rollback()
	c = outbox.WithTx(context.Background(), stx)
	if got, ok := outbox.SQLTxFromContext(c); !ok || got != stx {
		t.Fatalf("SQLTxFromContext = %v, %v", got, ok)
	}
	if _, ok := outbox.PgxTxFromContext(context.Background()); ok {
		t.Fatal("PgxTxFromContext found a transaction in an empty context")
	}
}
