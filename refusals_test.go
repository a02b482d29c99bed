package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Bad inputs of issue 10: each gets a typed error, never a panic or a
// quiet write.

func TestPublishOfNilMessagesIsATypedError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, msgs := range map[string][]*message.Message{
		"nil":          {nil},
		"m, nil":       {message.NewMessage("m", []byte("x")), nil},
		"nil, m, nil,": {nil, message.NewMessage("m", []byte("x"))},
	} {
		var me *outboxtype.MessageError
		if err := pub.Publish("orders", msgs...); !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) {
			t.Fatalf("Publish(%s) = %v, want ErrInvalidMessage", name, err)
		}
	}
	if n := e.Rows("pending"); n != 0 {
		t.Fatalf("%d rows written", n)
	}
}

// A handle that is not a transaction would write the message on its own,
// and it would survive the caller's rollback.
func TestWithTxRefusesHandlesThatAreNotTransactions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.DB(t)
	conn, err := e.Pool.Acquire(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	sqlConn, err := db.Conn(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer sqlConn.Close()
	for name, handle := range map[string]any{
		"*pgxpool.Pool":                 e.Pool,
		"*sql.DB":                       db,
		"*sql.Conn":                     sqlConn,
		"*pgx.Conn outside transaction": conn.Conn(),
	} {
		m := message.NewMessage("m", []byte("x"))
		m.SetContext(outbox.WithTx(outboxtest.Ctx(t), handle))
		var nt *outboxtype.NotInTxError
		if err := pub.Publish("orders", m); !errors.Is(err, outbox.ErrNotInTx) || !errors.As(err, &nt) {
			t.Fatalf("%s: Publish = %v, want ErrNotInTx", name, err)
		}
		if _, err := outbox.NewTxPublisher(handle, outbox.PublisherConfig{Schema: e.Schema}, nil); !errors.Is(err, outbox.ErrNotInTx) && name != "*pgx.Conn outside transaction" {
			t.Fatalf("%s: NewTxPublisher = %v, want ErrNotInTx", name, err)
		}
	}
	if n := e.Rows("pending"); n != 0 {
		t.Fatalf("%d rows written outside any transaction", n)
	}
	// A *pgx.Conn inside a transaction it began is one: the message goes
	// with its rollback.
	if _, err := conn.Exec(outboxtest.Ctx(t), "BEGIN"); err != nil {
		t.Fatal(err)
	}
	m := message.NewMessage("in-tx", []byte("x"))
	m.SetContext(outbox.WithTx(outboxtest.Ctx(t), conn.Conn()))
	if err := pub.Publish("orders", m); err != nil {
		t.Fatalf("Publish on a connection in a transaction: %v", err)
	}
	if _, err := conn.Exec(outboxtest.Ctx(t), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if n := e.Rows("pending"); n != 0 {
		t.Fatalf("%d rows survived the rollback", n)
	}
}

func TestEveryEntryPointRefusesAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	msg := func() *message.Message { return message.NewMessage("m", []byte("x")) }
	cases := map[string]func() error{
		"RegisterTopic": func() error { return outbox.RegisterTopic(outboxtest.Ctx(t), pool, schema, "orders", 1) },
		"TopicPartitions": func() error {
			_, err := outbox.TopicPartitions(outboxtest.Ctx(t), pool, schema, "orders")
			return err
		},
		"Publish (OwnTransaction)": func() error {
			pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: pool, OwnTransaction: true}, nil)
			if err != nil {
				return err
			}
			return pub.Publish("orders", msg())
		},
		"Publish (caller's transaction)": func() error {
			tx, err := pool.Begin(outboxtest.Ctx(t))
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
			if _, qerr := tx.Exec(outboxtest.Ctx(t), "SELECT 1"); qerr != nil {
				t.Errorf("the caller's transaction was aborted: %v", qerr)
			}
			return err
		},
		"Publish (WithTx on the message)": func() error {
			tx, err := pool.Begin(outboxtest.Ctx(t))
			if err != nil {
				return err
			}
			defer tx.Rollback(context.Background())
			pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema}, nil)
			if err != nil {
				return err
			}
			m := msg()
			m.SetContext(outbox.WithTx(outboxtest.Ctx(t), tx))
			err = pub.Publish("orders", m)
			if _, qerr := tx.Exec(outboxtest.Ctx(t), "SELECT 1"); qerr != nil {
				t.Errorf("the caller's transaction was aborted: %v", qerr)
			}
			return err
		},
		"Sequencer.SequenceAll": func() error {
			seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: pool}, nil)
			if err != nil {
				return err
			}
			_, err = seq.SequenceAll(outboxtest.Ctx(t))
			return err
		},
		"Sequencer.Run": func() error {
			seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: pool}, nil)
			if err != nil {
				return err
			}
			c, cancel := context.WithTimeout(outboxtest.Ctx(t), 10*time.Second)
			defer cancel()
			return seq.Run(c)
		},
	}
	for name, run := range cases {
		err := run()
		var nm *outboxtype.NotMigratedError
		if !errors.Is(err, outbox.ErrNotMigrated) || !errors.As(err, &nm) || !strings.Contains(err.Error(), "outbox.Migrate") {
			t.Errorf("%s: %v, want ErrNotMigrated naming outbox.Migrate", name, err)
		}
	}
}

func TestWritersRefuseASchemaMigratedByANewerRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	pool := pgtest.Pool(t) // a pool whose schema check is not cached yet
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "INSERT INTO "+e.Schema+".schema_migrations (version, name) VALUES ($1, 'future')", outbox.SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage("m", []byte("x"))); !errors.Is(err, outbox.ErrSchemaTooNew) {
		t.Fatalf("Publish: %v, want ErrSchemaTooNew", err)
	}
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seq.SequenceAll(outboxtest.Ctx(t)); !errors.Is(err, outbox.ErrSchemaTooNew) {
		t.Fatalf("SequenceAll: %v, want ErrSchemaTooNew", err)
	}
	if err := outbox.RegisterTopic(outboxtest.Ctx(t), pool, e.Schema, "other", 1); !errors.Is(err, outbox.ErrSchemaTooNew) {
		t.Fatalf("RegisterTopic: %v, want ErrSchemaTooNew", err)
	}
	if n := e.Rows("pending") + e.Rows("topics"); n != 1 {
		t.Fatalf("rows written into a newer schema (pending + topics = %d, want the 1 topic)", n)
	}
}

// Concurrent Migrate calls on a schema that was dropped earlier, with a
// version lookup first on the same pool, used to fail with a unique
// violation on pg_namespace now and then.
func TestConcurrentMigrateOfADroppedSchemaNeverFails(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	for round := 0; round < 50; round++ {
		if _, err := pool.Exec(outboxtest.Ctx(t), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.CurrentSchemaVersion(outboxtest.Ctx(t), pool, schema); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := outbox.Migrate(outboxtest.Ctx(t), pool, schema); err != nil {
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
	t.Parallel()
	pool := pgtest.Pool(t)
	for _, schema := range []string{"information_schema", "pg_catalog", "pg_toast", "pg_mine"} {
		if err := outbox.Migrate(outboxtest.Ctx(t), pool, schema); !errors.Is(err, outbox.ErrInvalidName) {
			t.Fatalf("Migrate(%q) = %v, want ErrInvalidName", schema, err)
		}
	}
	var n int
	if err := pool.QueryRow(outboxtest.Ctx(t), "SELECT count(*) FROM pg_tables WHERE schemaname = 'information_schema' AND tablename IN ('pending', 'log', 'topics')").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d outbox tables in information_schema (%v)", n, err)
	}
}

func TestPublishLimitsMetadataAndTheCallsSize(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	huge := message.NewMessage("huge-metadata", []byte("x"))
	huge.Metadata.Set("blob", strings.Repeat("m", 50<<20)) // 50 MB under a 1 MiB payload limit
	var le *outboxtype.LimitError
	if err := pub.Publish("orders", huge); !errors.Is(err, outbox.ErrMetadataTooLarge) || !errors.As(err, &le) || le.UUID != "huge-metadata" {
		t.Fatalf("50 MB of metadata: %v, want ErrMetadataTooLarge", err)
	}
	// Each message within MaxPayloadBytes, the call over MaxPublishBytes:
	// refused before anything is sent.
	big, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true,
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
	if n := e.Rows("pending"); n != 2 {
		t.Fatalf("%d rows, want the 2 of the accepted call", n)
	}
	for _, bad := range []outbox.PublisherConfig{
		{Schema: e.Schema, MaxMetadataBytes: -1},
		{Schema: e.Schema, MaxPayloadBytes: 8 << 20, MaxPublishBytes: 4 << 20},
		{Schema: e.Schema, MaxPublishBytes: 2 << 30},
	} {
		if err := bad.Validate(); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Fatalf("Validate(%+v) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}

func TestTypedTransactionAccessors(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	tx, err := pool.Begin(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	c := outbox.WithTx(context.Background(), tx)
	if got, ok := outbox.TxFromContext[pgx.Tx](c); !ok || got != pgx.Tx(tx) {
		t.Fatalf("TxFromContext[pgx.Tx] = %v, %v", got, ok)
	}
	if _, ok := outbox.TxFromContext[*sql.Tx](c); ok {
		t.Fatal("TxFromContext[*sql.Tx] found a *sql.Tx in a pgx context")
	}
	stx, err := pgtest.DB(t).BeginTx(outboxtest.Ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stx.Rollback()
	c = outbox.WithTx(context.Background(), stx)
	if got, ok := outbox.TxFromContext[*sql.Tx](c); !ok || got != stx {
		t.Fatalf("TxFromContext[*sql.Tx] = %v, %v", got, ok)
	}
	if _, ok := outbox.TxFromContext[pgx.Tx](context.Background()); ok {
		t.Fatal("TxFromContext[pgx.Tx] found a transaction in an empty context")
	}
	// watermill-sql's adapters are unwrapped.
	if got, ok := outbox.TxFromContext[pgx.Tx](outbox.WithTx(context.Background(), wsql.TxFromPgx(tx))); !ok || got != pgx.Tx(tx) {
		t.Fatalf("TxFromContext[pgx.Tx](watermill-sql PgxTx) = %v, %v", got, ok)
	}
	if got, ok := outbox.TxFromContext[*sql.Tx](outbox.WithTx(context.Background(), wsql.TxFromStdSQL(stx))); !ok || got != stx {
		t.Fatalf("TxFromContext[*sql.Tx](watermill-sql StdSQLTx) = %v, %v", got, ok)
	}
	if _, ok := outbox.TxFromContext[*sql.Tx](outbox.WithTx(context.Background(), (*sql.Tx)(nil))); ok {
		t.Fatal("TxFromContext[*sql.Tx] returned a nil *sql.Tx as found")
	}
	if _, ok := outbox.TxFromContext[pgx.Tx](outbox.WithTx(context.Background(), (*wsql.PgxTx)(nil))); ok {
		t.Fatal("TxFromContext[pgx.Tx] found a transaction in a nil watermill-sql adapter")
	}
	// TxFromContext[any] returns the handle as it was given; the adapter
	// itself can be asked for too.
	adapter := wsql.TxFromPgx(tx)
	if got, ok := outbox.TxFromContext[any](outbox.WithTx(context.Background(), adapter)); !ok || got != any(adapter) {
		t.Fatalf("TxFromContext[any](adapter) = %v, %v", got, ok)
	}
	if _, ok := outbox.TxFromContext[any](context.Background()); ok {
		t.Fatal("TxFromContext[any] found a transaction in an empty context")
	}
}

// A nil message in a NewTxPublisher's call is refused the same way, and the
// error names its position.
func TestTxPublisherRefusesNilMessagesNamingTheIndex(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	tx, err := e.Pool.Begin(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	pub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: e.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var me *outboxtype.MessageError
	err = pub.Publish("orders", message.NewMessage("a", []byte("x")), nil)
	if !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) || !strings.Contains(err.Error(), "message 1 ") {
		t.Fatalf("Publish(m, nil) = %v, want ErrInvalidMessage naming message 1", err)
	}
	if err := tx.Commit(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if n := e.Rows("pending"); n != 0 {
		t.Fatalf("%d rows written", n)
	}
}

// Every kind of handle that is not a transaction is refused, by WithTx and
// by NewTxPublisher; every kind that is one writes inside it, so the
// message goes with its rollback. OwnTransaction keeps working.
func TestOnlyTransactionsAreAcceptedAsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	db := pgtest.DB(t)
	pconn, err := e.Pool.Acquire(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Release()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, handle := range map[string]any{
		"*pgxpool.Conn":          pconn,
		"watermill-sql pgx pool": wsql.BeginnerFromPgx(e.Pool),
		"watermill-sql *sql.DB":  wsql.BeginnerFromStdSQL(db),
		"*pgx.Conn (no BEGIN)":   pconn.Conn(),
		"*pgxpool.Pool":          e.Pool,
		"*sql.DB":                db,
	} {
		m := message.NewMessage("m", []byte("x"))
		m.SetContext(outbox.WithTx(outboxtest.Ctx(t), handle))
		if err := pub.Publish("orders", m); !errors.Is(err, outbox.ErrNotInTx) || !strings.Contains(err.Error(), "begin a transaction") {
			t.Errorf("%s via WithTx: Publish = %v, want ErrNotInTx saying to begin a transaction", name, err)
		}
		tp, err := outbox.NewTxPublisher(handle, outbox.PublisherConfig{Schema: e.Schema}, nil)
		if err == nil {
			err = tp.Publish("orders", message.NewMessage("m", []byte("x")))
		}
		if !errors.Is(err, outbox.ErrNotInTx) {
			t.Errorf("%s via NewTxPublisher: %v, want ErrNotInTx", name, err)
		}
	}
	if n := e.Rows("pending"); n != 0 {
		t.Fatalf("%d rows written outside any transaction", n)
	}

	// Real transactions of every supported kind: rolled back, nothing stays.
	ptx, err := e.Pool.Begin(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	stx, err := db.BeginTx(outboxtest.Ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, tx := range map[string]any{
		"pgx.Tx":                ptx,
		"*sql.Tx":               stx,
		"watermill-sql pgx Tx":  wsql.TxFromPgx(ptx),
		"watermill-sql *sql.Tx": wsql.TxFromStdSQL(stx),
	} {
		m := message.NewMessage("rolled-back", []byte("x"))
		m.SetContext(outbox.WithTx(outboxtest.Ctx(t), tx))
		if err := pub.Publish("orders", m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if err := ptx.Rollback(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := stx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := e.Rows("pending"); n != 0 {
		t.Fatalf("%d rows survived the rollbacks", n)
	}

	own, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Publish("orders", message.NewMessage("own", []byte("x"))); err != nil {
		t.Fatalf("OwnTransaction: %v", err)
	}
	if n := e.Rows("pending"); n != 1 {
		t.Fatalf("OwnTransaction wrote %d rows, want 1", n)
	}
}

// The schema check of a Publisher with DB reads the version in the caller's
// transaction: it must not wait for a second connection, which a pool that
// is all held by transactions does not have.
func TestSchemaCheckNeedsNoSecondConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(outboxtest.Ctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(outboxtest.Ctx(t)) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	c, cancel := context.WithTimeout(outboxtest.Ctx(t), 5*time.Second)
	defer cancel()
	m := message.NewMessage("m", []byte("x"))
	m.SetContext(outbox.WithTx(c, tx))
	if err := pub.Publish("orders", m); err != nil {
		t.Fatalf("Publish in the only connection's transaction: %v", err)
	}
	if err := tx.Commit(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if n := e.Rows("pending"); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// A NewTxPublisher per transaction (the Replay pattern, and a common one in
// handlers) checks the schema once per database, not once per Publisher.
func TestSchemaCheckIsCachedAcrossTxPublishers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	pool, counter := countingPool(t)
	publishOnce := func() {
		tx, err := pool.Begin(outboxtest.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		pub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: e.Schema}, nil)
		if err != nil {
			t.Fatal(err)
		}
		before := counter.n.Load()
		if err := pub.Publish("orders", message.NewMessage("m", []byte("x"))); err != nil {
			t.Fatal(err)
		}
		// One topic lookup (a new Publisher's topic cache is empty) and the
		// insert: no schema check.
		if n := counter.n.Load() - before; n > 2 {
			t.Errorf("a new TxPublisher's first Publish sent %d statements, want 2 (the schema check is cached)", n)
		}
		if err := tx.Commit(outboxtest.Ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	warm, err := pool.Begin(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	wp, err := outbox.NewTxPublisher(warm, outbox.PublisherConfig{Schema: e.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := wp.Publish("orders", message.NewMessage("warm", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	if err := warm.Commit(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		publishOnce()
	}
}

// A schema dropped after the check was cached: the write's own error is
// turned into ErrNotMigrated (Wrap), for the Publisher and the Sequencer.
func TestASchemaDroppedAfterTheCheckIsErrNotMigrated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage("m", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seq.SequenceAll(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "DROP SCHEMA "+e.Schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage("m", []byte("x"))); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("Publish after the drop: %v, want ErrNotMigrated", err)
	}
	if _, err := seq.SequenceAll(outboxtest.Ctx(t)); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("SequenceAll after the drop: %v, want ErrNotMigrated", err)
	}
	if _, err := outbox.TopicPartitions(outboxtest.Ctx(t), e.Pool, e.Schema, "orders"); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("TopicPartitions after the drop: %v, want ErrNotMigrated", err)
	}
}

// Sequencer.Run returns at once for a schema it cannot work with, but keeps
// retrying (and returns nil when stopped) while the database is only
// unreachable: a service started before its database must not lose its
// sequencer.
func TestSequencerRunRetriesAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(outboxtest.Ctx(t), "postgres://outbox@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: "unreachable", Pool: pool, DisableListen: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(outboxtest.Ctx(t), 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := seq.Run(c); err != nil {
		t.Fatalf("Run on an unreachable database returned %v after %v; want it to retry until stopped, then nil", err, time.Since(start))
	}
}

// Every entry point refuses the system schemas.
func TestEveryEntryPointRefusesSystemSchemas(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for _, schema := range []string{"information_schema", "pg_catalog", "pg_toast", "pg_temp_1"} {
		_, pubErr := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema}, nil)
		_, seqErr := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: pool}, nil)
		_, verErr := outbox.CurrentSchemaVersion(outboxtest.Ctx(t), pool, schema)
		for name, err := range map[string]error{
			"Migrate":              outbox.Migrate(outboxtest.Ctx(t), pool, schema),
			"RegisterTopic":        outbox.RegisterTopic(outboxtest.Ctx(t), pool, schema, "orders", 1),
			"NewPublisher":         pubErr,
			"NewSequencer":         seqErr,
			"CurrentSchemaVersion": verErr,
		} {
			var ne *outboxtype.NameError
			if !errors.Is(err, outbox.ErrInvalidName) || !errors.As(err, &ne) {
				t.Errorf("%s(%q) = %v, want ErrInvalidName", name, schema, err)
			}
		}
	}
}

// A Transactional Subscriber's handler gets the batch's transaction with
// TxFromContext[pgx.Tx], no type assertion, and can write and publish in it.
func TestTransactionalHandlerGetsItsTxFromPgxTxFromContext(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("in", 1)
	e.Register("out", 1)
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "CREATE TABLE "+e.Schema+".effects (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	in, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := in.Publish("in", message.NewMessage(fmt.Sprint("in-", i), []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	out, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) { c.Strategy = outbox.Transactional })
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "in")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		var m *message.Message
		select {
		case m = <-msgs:
		case <-time.After(time.Minute):
			t.Fatal("no delivery")
		}
		tx, ok := outbox.TxFromContext[pgx.Tx](m.Context())
		if !ok {
			t.Fatal("TxFromContext[pgx.Tx] found no pgx.Tx in a Transactional delivery")
		}
		if _, ok := outbox.TxFromContext[*sql.Tx](m.Context()); ok {
			t.Fatal("TxFromContext[*sql.Tx] found a *sql.Tx in a Transactional delivery")
		}
		if _, err := tx.Exec(m.Context(), "INSERT INTO "+e.Schema+".effects VALUES ($1)", m.UUID); err != nil {
			t.Fatal(err)
		}
		follow := message.NewMessage("out-"+m.UUID, []byte("y"))
		follow.SetContext(m.Context()) // the delivery's transaction
		if err := out.Publish("out", follow); err != nil {
			t.Fatalf("publish in the delivery's transaction: %v", err)
		}
		m.Ack()
	}
	outboxtest.WaitFor(t, "the effects to commit", time.Minute, func() bool { return e.Rows("effects") == 3 })
	// The follow-ups committed with the effects, in the same transactions.
	var follow int
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT (SELECT count(*) FROM "+e.Schema+".pending WHERE topic = 'out') + (SELECT count(*) FROM "+e.Schema+".log WHERE topic = 'out')").Scan(&follow); err != nil || follow != 3 {
		t.Fatalf("%d follow-up messages (%v), want 3", follow, err)
	}
}

// The schema check of RegisterTopic on a *pgx.Conn is cached per database,
// not per connection: a new connection does not check again (and short-lived
// connections do not pile up in the cache).
func TestSchemaCheckOfAPgxConnIsCachedPerDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	counter := &queryCounter{}
	cfg.Tracer = counter
	register := func(topic string) int64 {
		conn, err := pgx.ConnectConfig(outboxtest.Ctx(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		before := counter.n.Load()
		if err := outbox.RegisterTopic(outboxtest.Ctx(t), conn, e.Schema, topic, 1); err != nil {
			t.Fatal(err)
		}
		return counter.n.Load() - before
	}
	first, second, third := register("a"), register("b"), register("c")
	if second != first-1 || third != second {
		t.Fatalf("RegisterTopic on three new connections sent %d, %d, %d statements; want the schema checked on the first only", first, second, third)
	}
}
