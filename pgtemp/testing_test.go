package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/outboxtest"
)

// Schema gives a schema with the outbox migrated, on a pool whose
// search_path it is: the application's table goes there, a Publisher
// publishes in its transaction, outboxtest sees the message; the schema is
// dropped when the test ends.
func TestSchemaIsAMigratedOutboxAnApplicationPublishesIn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var schema string
	t.Run("application test", func(t *testing.T) {
		pool, s := Schema(t)
		schema = s
		if _, err := pool.Exec(ctx, `CREATE TABLE orders (id integer PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		if err := outbox.RegisterTopic(ctx, pool, schema, "orders", 1); err != nil {
			t.Fatal(err)
		}
		pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (42)`); err != nil {
				return err
			}
			m := message.NewMessage("order-42", []byte(`{"id":42}`))
			m.SetContext(outbox.WithTx(ctx, tx))
			return pub.Publish("orders", m)
		})
		if err != nil {
			t.Fatal(err)
		}
		outboxtest.RequirePublished(t, pool, "orders", outboxtest.InSchema(schema), outboxtest.JSON(`{"id":42}`), outboxtest.Times(1))
		var table string
		if err := pool.QueryRow(ctx, `SELECT table_schema FROM information_schema.tables WHERE table_name = 'orders'`).Scan(&table); err != nil || table != schema {
			t.Fatalf("the application's table is in %q (%v), want the test's schema %q", table, err, schema)
		}
	})
	conn, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("schema %s: %d left after its test (%v)", schema, n, err)
	}
}

// Two tests get two schemas, on one server.
func TestSchemasAreTheTestsOwn(t *testing.T) {
	_, a := Schema(t)
	_, b := Schema(t)
	if a == b || a == "" {
		t.Fatalf("schemas %q and %q", a, b)
	}
}

// OUTBOX_TEST_DATABASE_URL wins: URL and Schema use that server, and no
// server of the test binary is started for them.
func TestTheDatabaseURLFromTheEnvironmentWins(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	other, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Stop()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "PGTEMP_HELPER=env-url", EnvDatabaseURL+"="+other.URL(""))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "HELPER OK") {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestHelperProcess is run by the tests above in a child process (the
// shared server and Main are per process).
func TestHelperProcess(t *testing.T) {
	switch os.Getenv("PGTEMP_HELPER") {
	case "":
		t.Skip("run by other tests")
	case "env-url":
		want := os.Getenv(EnvDatabaseURL)
		if got := URL(t); got != want {
			t.Fatalf("URL = %q, want %q", got, want)
		}
		pool, schema := Schema(t)
		var on string
		if err := pool.QueryRow(context.Background(), `SELECT current_schema() || ' ' || inet_server_port()`).Scan(&on); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(on, schema+" ") || !strings.Contains(want, fmt.Sprintf(":%s/", strings.Fields(on)[1])) {
			t.Fatalf("Schema's pool is on %q, want schema %s on %s", on, schema, want)
		}
		shared.mu.Lock()
		started := shared.server != nil
		shared.mu.Unlock()
		if started {
			t.Fatal("a server was started although OUTBOX_TEST_DATABASE_URL is set")
		}
		fmt.Println("HELPER OK")
	case "main-nil":
		Main(nil)
	}
}

// recorder is a testing.TB that records Fatalf instead of stopping.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

// Refusals: nil and zero input is an error of the package's, never a
// panic; URL and Schema without Main fail the test saying what to do.
func TestNilAndZeroArgumentsAreRefused(t *testing.T) {
	var noCtx context.Context
	if _, err := Start(noCtx, Options{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Start(nil): %v", err)
	}
	if _, err := Fetch(noCtx, FetchOptions{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Fetch(nil): %v", err)
	}
	if _, err := BinDir(noCtx, FetchOptions{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("BinDir(nil): %v", err)
	}
	ctx := context.Background()
	for _, o := range []FetchOptions{{Repository: "ftp://example.com"}, {Repository: "not a url"}, {Version: "../15.0.0"}, {Version: ".hidden"}} {
		if _, err := Fetch(ctx, o); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Fetch(%+v): %v, want ErrInvalidArgument", o, err)
		}
	}
	var s *Server
	if s.URL("") != "" || s.Port() != 0 || s.BinDir() != "" {
		t.Error("a nil Server has a URL, port or bin directory")
	}
	s.Stop()
	(&Server{}).Stop()
	if URL(nil) != "" {
		t.Error("URL(nil) returned a URL")
	}
	if p, name := Schema(nil); p != nil || name != "" {
		t.Error("Schema(nil) returned a schema")
	}

	// As in a test binary whose TestMain does not call Main.
	shared.mu.Lock()
	main, server, url, serr := shared.main, shared.server, shared.url, shared.err
	shared.main, shared.server, shared.url, shared.err = false, nil, "", nil
	shared.mu.Unlock()
	t.Setenv(EnvDatabaseURL, "")
	rec := &recorder{TB: t}
	got := URL(rec)
	shared.mu.Lock()
	shared.main, shared.server, shared.url, shared.err = main, server, url, serr
	shared.mu.Unlock()
	if got != "" || !strings.Contains(rec.failed, ErrNoMain.Error()) {
		t.Errorf("URL without Main: %q, failure %q; want ErrNoMain", got, rec.failed)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), "PGTEMP_HELPER=main-nil")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), ErrInvalidArgument.Error()) || strings.Contains(string(out), "panic") {
		t.Errorf("Main(nil): %v\n%s", err, out)
	}
}
