package pgcluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// fakeTree makes dir/bin with executable initdb and postgres (or only
// initdb: an incomplete tree).
func fakeTree(t *testing.T, dir string, complete bool) string {
	t.Helper()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	names := []string{"initdb"}
	if complete {
		names = append(names, "postgres")
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(bin, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// FindBinDir's order: PG_BINDIR, the installed PostgreSQL (unless
// OUTBOX_POSTGRES_IGNORE_SYSTEM hides it), the newest complete tree of the
// cache.
func TestFindBinDirPrefersPGBINDIRThenTheInstalledThenTheNewestCached(t *testing.T) {
	cache := t.TempDir()
	fakeTree(t, filepath.Join(cache, "9.6.24"), true)
	want := fakeTree(t, filepath.Join(cache, "15.13.0"), true)
	fakeTree(t, filepath.Join(cache, "17.5.0"), false) // incomplete: ignored
	fakeTree(t, filepath.Join(cache, ".fetch-123", "tree"), true)
	t.Setenv(EnvCacheDir, cache)
	t.Setenv(EnvBinDir, "")

	t.Setenv(EnvIgnoreSystem, "1")
	if d, err := FindBinDir(); err != nil || d != want {
		t.Fatalf("FindBinDir() = %s, %v; want the cache's newest complete tree %s", d, err, want)
	}
	if d, ok := CachedBinDir(cache, "9.6.24"); !ok || d != filepath.Join(cache, "9.6.24", "bin") {
		t.Fatalf("CachedBinDir(9.6.24) = %s, %v", d, ok)
	}
	if _, ok := CachedBinDir(cache, "17.5.0"); ok {
		t.Fatal("an incomplete tree counts")
	}

	explicit := fakeTree(t, t.TempDir(), true)
	t.Setenv(EnvBinDir, explicit)
	if d, err := FindBinDir(); err != nil || d != explicit {
		t.Fatalf("with PG_BINDIR: %s, %v", d, err)
	}
	t.Setenv(EnvBinDir, t.TempDir())
	if _, err := FindBinDir(); !errors.Is(err, ErrNoServerBinaries) {
		t.Fatalf("PG_BINDIR without binaries: %v, want ErrNoServerBinaries", err)
	}
	t.Setenv(EnvBinDir, "")

	t.Setenv(EnvIgnoreSystem, "")
	if sys, err := SystemBinDir(); err == nil {
		if d, err := FindBinDir(); err != nil || d != sys {
			t.Fatalf("with PostgreSQL installed: %s, %v; want it (%s)", d, err, sys)
		}
	}

	t.Setenv(EnvIgnoreSystem, "1")
	t.Setenv(EnvCacheDir, t.TempDir())
	if _, err := FindBinDir(); !errors.Is(err, ErrNoServerBinaries) {
		t.Fatalf("nothing anywhere: %v, want ErrNoServerBinaries", err)
	}
}

func TestVersionLess(t *testing.T) {
	for _, c := range []struct {
		a, b string
		less bool
	}{{"9.6.24", "15.13.0", true}, {"15.13.0", "15.2.0", false}, {"15.13", "15.13.0", true}, {"17.5.0", "17.5.0", false}} {
		if versionLess(c.a, c.b) != c.less {
			t.Errorf("versionLess(%s, %s) = %v", c.a, c.b, !c.less)
		}
	}
}

// As root on a machine without a "postgres" user (Go only, in a container),
// the server runs as "nobody".
func TestAsRootWithoutAPostgresUserTheServerRunsAsNobody(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs as root only")
	}
	bindir, err := FindBinDir()
	if err != nil {
		t.Skip(err)
	}
	saved := serverUsers
	serverUsers = []string{"no-such-user-here", "nobody"}
	defer func() { serverUsers = saved }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{BinDir: bindir})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	conn, err := pgx.Connect(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var one int
	if err := conn.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(c.dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	nobody, _ := postgresCredential()
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid != nobody.Uid {
		t.Fatalf("the data directory belongs to uid %d, want nobody's %d", uid, nobody.Uid)
	}
}
