// Package pgtest gives tests a real PostgreSQL server: a throwaway cluster
// started once per test binary (see internal/pgcluster), or the server named
// by OUTBOX_TEST_DATABASE_URL. Each test gets its own schema.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Where no PostgreSQL server binaries are installed or cached, StartCluster
// (and so Main) fetches them into the cache first, as package pgtemp does
// for applications and for the demo: by running pgtemp's fetch-postgres
// command from the workspace (go run, in the pgtemp directory next to this
// module's go.work). It cannot call pgtemp: pgtemp is a module of its own
// that requires github.com/fergusstrange/embedded-postgres, and the library
// module must not require it, lest every application's module graph
// inherit it; a package of the library module (this one included) cannot
// import another module's package without its go.mod requiring that module.
// Outside the workspace (a copy of the module alone) the command is not
// there, and the tests fail as before, saying what to install.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/millrace/watermill-outbox/internal/pgcluster"
)

// EnvDatabaseURL names the environment variable that points the tests at an
// existing server instead of a throwaway cluster.
const EnvDatabaseURL = "OUTBOX_TEST_DATABASE_URL"

// EnvExampleURL is set by Main to the test database, for the Example
// functions, which read it as an application reads its connection string.
const EnvExampleURL = "DATABASE_URL"

var (
	databaseURL string
	external    bool
)

// Main starts the server, runs the tests and stops the server, also when the
// tests fail or panic. It does not return.
func Main(m *testing.M) {
	os.Exit(run(m, pgcluster.Options{}))
}

// MainWith is Main with a throwaway cluster started with opts (e.g.
// wal_level = logical for the log-based mode's tests). With
// OUTBOX_TEST_DATABASE_URL set, that server must be configured so.
func MainWith(m *testing.M, opts pgcluster.Options) {
	os.Exit(run(m, opts))
}

func run(m *testing.M, opts pgcluster.Options) int {
	if url := os.Getenv(EnvDatabaseURL); url != "" {
		databaseURL, external = url, true
		os.Setenv(EnvExampleURL, url)
		return m.Run()
	}
	cluster, err := StartCluster(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		return 1
	}
	defer cluster.Stop()
	databaseURL = cluster.URL("postgres")
	// Example functions connect as an application would, through
	// DATABASE_URL, so that the code they show has no test helper in it.
	os.Setenv(EnvExampleURL, databaseURL)
	return m.Run()
}

// StartCluster starts a throwaway cluster (pgcluster.Start), fetching
// server binaries first when none are installed or cached (see the package
// documentation). It allows two minutes for the start, and ten for a fetch.
func StartCluster(ctx context.Context, opts pgcluster.Options) (*pgcluster.Cluster, error) {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	cluster, err := pgcluster.Start(sctx, opts)
	cancel()
	if !errors.Is(err, pgcluster.ErrNoServerBinaries) || opts.BinDir != "" {
		return cluster, err
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	bindir, ferr := fetchFromWorkspace(fctx)
	cancel()
	if ferr != nil {
		return nil, fmt.Errorf("%w; fetching them failed too: %v", err, ferr)
	}
	opts.BinDir, opts.Movable = bindir, true
	sctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return pgcluster.Start(sctx, opts)
}

// fetchFromWorkspace runs pgtemp's fetch-postgres command (go run, in the
// pgtemp module of the workspace this package's tests run in) and returns
// the bin directory it prints. Its one progress line goes to standard
// error.
func fetchFromWorkspace(ctx context.Context) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "pgtemp", "cmd", "fetch-postgres")); err == nil {
				break
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("pgtest: no workspace (go.work) with pgtemp/cmd/fetch-postgres above the working directory, to fetch PostgreSQL with")
		}
		dir = parent
	}
	cmd := exec.CommandContext(ctx, "go", "run", "./cmd/fetch-postgres")
	cmd.Dir = filepath.Join(dir, "pgtemp")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("pgtest: go run ./cmd/fetch-postgres in %s: %w", cmd.Dir, err)
	}
	return strings.TrimSpace(out.String()), nil
}

// URL is the connection string of the test database. It fails the test when
// Main was not used.
func URL(t testing.TB) string {
	t.Helper()
	if databaseURL == "" {
		t.Fatal("pgtest: no database; call pgtest.Main from TestMain")
	}
	return databaseURL
}

// Pool opens a connection pool that is closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Close waits for every acquired connection; a test that failed with a
		// transaction open would hang here, so report it instead.
		done := make(chan struct{})
		go func() { pool.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Errorf("pgtest: pool not closed after 15s: a connection is still acquired (open transaction?)")
		}
	})
	return pool
}

// DB opens a database/sql handle (pgx's stdlib driver) closed when the test
// ends.
func DB(t testing.TB) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(URL(t))
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Schema returns a fresh schema name for this test. The schema itself is
// created by whoever uses it (the outbox migrations create theirs); it is
// dropped when the test ends if the server is not a throwaway one.
func Schema(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "t_" + hex.EncodeToString(b)
	if external {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, databaseURL)
			if err != nil {
				t.Logf("pgtest: drop schema %s: %v", name, err)
				return
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
				t.Logf("pgtest: drop schema %s: %v", name, err)
			}
		})
	}
	return name
}

// DropSchemaUnder drops schema while components may still be running on it
// (a test of what they do once it is gone). PostgreSQL may choose the DROP
// as the victim of a deadlock with a running component's statement
// (SQLSTATE 40P01); the DROP is retried then, up to 50 times, and any other
// error fails the test.
func DropSchemaUnder(t testing.TB, pool *pgxpool.Pool, schema string) {
	t.Helper()
	stmt := "DROP SCHEMA " + pgx.Identifier{schema}.Sanitize() + " CASCADE"
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		_, err := pool.Exec(ctx, stmt)
		cancel()
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return
		case errors.As(err, &pgErr) && pgErr.Code == "40P01" && attempt < 50:
			t.Logf("pgtest: drop schema %s: deadlock with a running component, retrying (attempt %d)", schema, attempt)
		default:
			t.Fatalf("pgtest: drop schema %s: %v", schema, err)
		}
	}
}

// External reports whether the tests run against OUTBOX_TEST_DATABASE_URL
// rather than a throwaway cluster.
func External() bool { return external }

// DatabaseURL is the connection string of the test database, for code that
// has no testing.TB (Example functions). It is empty outside Main.
func DatabaseURL() string { return databaseURL }

// FreezablePool opens a pool (closed when the test ends) whose connection
// acquisitions block while it is frozen. To the database that is what a
// paused or cut-off process looks like: no lease renewals, no heartbeats, no
// cursor writes, until it thaws. freeze and thaw are idempotent.
func FreezablePool(t testing.TB) (pool *pgxpool.Pool, freeze, thaw func()) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	frozen := false
	thawed := make(chan struct{})
	close(thawed)
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		mu.Lock()
		gate := thawed
		mu.Unlock()
		select {
		case <-gate:
			return true, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	freeze = func() {
		mu.Lock()
		defer mu.Unlock()
		if !frozen {
			frozen, thawed = true, make(chan struct{})
		}
	}
	thaw = func() {
		mu.Lock()
		defer mu.Unlock()
		if frozen {
			frozen = false
			close(thawed)
		}
	}
	return pool, freeze, thaw
}

// Database creates a database of its own for this test on the test server
// (dropped when the test ends) and returns its connection string: for
// tests of several databases with the same schema names, as a sharded
// application has.
func Database(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "d_" + hex.EncodeToString(b)
	conn, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, databaseURL)
		if err != nil {
			t.Logf("pgtest: drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Logf("pgtest: drop database %s: %v", name, err)
		}
	})
	return withDatabase(URL(t), name)
}

// withDatabase returns the connection string dsn (a URL or key=value
// pairs) with its database set to name.
func withDatabase(dsn, name string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	return dsn + " dbname=" + name // the last one counts
}
