package pgtemp

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/outboxtest"
)

// shared is the one server of a test binary.
var shared struct {
	mu     sync.Mutex
	main   bool // Main runs the tests
	server *Server
	url    string
	err    error // the first start's failure, given to every test after
}

// Main runs the tests of the package and then stops the server they used,
// if any. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtemp.Main(m) }
//
// The server is started when a test first calls URL or Schema, so a run of
// tests that use none starts none; with OUTBOX_TEST_DATABASE_URL set, none
// is ever started. Main does not return. Given a nil m it prints
// ErrInvalidArgument and exits with status 2.
func Main(m *testing.M) {
	if m == nil {
		fmt.Fprintf(os.Stderr, "%v: pgtemp.Main(nil)\n", ErrInvalidArgument)
		os.Exit(2)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()
	defer func() {
		shared.mu.Lock()
		defer shared.mu.Unlock()
		shared.server.Stop()
		shared.server, shared.url, shared.main = nil, "", false
	}()
	return m.Run()
}

// sharedURL returns the test database's URL, starting the server on the
// first call.
func sharedURL() (string, error) {
	if url := os.Getenv(EnvDatabaseURL); url != "" {
		return url, nil
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.url != "" || shared.err != nil {
		return shared.url, shared.err
	}
	if !shared.main {
		return "", ErrNoMain
	}
	// Room for a first fetch on a slow link.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{})
	if err != nil {
		shared.err = err
		return "", err
	}
	shared.server, shared.url = s, s.URL("")
	return shared.url, nil
}

// URL returns the connection string of the test database: the throwaway
// server of this test binary (see Main), started on the first call, or the
// server OUTBOX_TEST_DATABASE_URL names. It fails the test when there is
// none. Tests that share it see each other's tables: Schema gives each a
// schema of its own.
func URL(t testing.TB) string {
	if t == nil {
		fmt.Fprintf(os.Stderr, "%v: pgtemp.URL(nil)\n", ErrInvalidArgument)
		return ""
	}
	t.Helper()
	url, err := sharedURL()
	if err != nil {
		t.Fatalf("pgtemp.URL: %v", err)
		return ""
	}
	return url
}

// Schema gives the test a schema of its own on the test database (URL's),
// with the outbox migrated into it (outboxtest.Schema), and a pool whose
// connections have it as their search_path, so that the application's own
// tables go there too. Both are removed when the test ends: the pool
// closed, the schema dropped with everything in it. Tests that each use
// their own schema can run in parallel. Pass the name to the outbox
// configs (PublisherConfig.Schema, SubscriberConfig.Schema) and to the
// outboxtest assertions (outboxtest.InSchema).
func Schema(t testing.TB) (*pgxpool.Pool, string) {
	if t == nil {
		fmt.Fprintf(os.Stderr, "%v: pgtemp.Schema(nil)\n", ErrInvalidArgument)
		return nil, ""
	}
	t.Helper()
	url := URL(t)
	if url == "" {
		return nil, ""
	}
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("pgtemp.Schema: %v", err)
		return nil, ""
	}
	t.Cleanup(admin.Close) // after the schema is dropped (cleanups run last first)
	schema := outboxtest.Schema(t, admin)
	if schema == "" {
		return nil, ""
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtemp.Schema: %v", err)
		return nil, ""
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if cfg.MaxConns < 24 {
		cfg.MaxConns = 24 // a Transactional subscriber (16 partitions at once, and its leases and sequencer) and its handler's transactions
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtemp.Schema: %v", err)
		return nil, ""
	}
	t.Cleanup(func() {
		// Close waits for every acquired connection: a test that failed
		// with a transaction open would hang here; say so instead.
		done := make(chan struct{})
		go func() { pool.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Errorf("pgtemp.Schema: pool not closed after 15s: a connection is still acquired (a transaction left open?)")
		}
	})
	return pool, schema
}
