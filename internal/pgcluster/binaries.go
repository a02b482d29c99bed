package pgcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Where the server binaries are looked for, in FindBinDir's order.
const (
	// EnvBinDir names a directory holding initdb and postgres: it is used
	// first, whatever else is installed.
	EnvBinDir = "PG_BINDIR"
	// EnvIgnoreSystem, set to a non-empty value, hides the PostgreSQL
	// installed on the machine (pg_config, /usr/lib/postgresql/*/bin,
	// PATH) from FindBinDir, as if it were not there: only PG_BINDIR and
	// the cache count. It exists to prove the fetch path on a machine that
	// has PostgreSQL (a contributor's, CI's); nobody needs it otherwise.
	EnvIgnoreSystem = "OUTBOX_POSTGRES_IGNORE_SYSTEM"
	// EnvCacheDir names the directory that holds fetched binaries, one
	// subdirectory per version, instead of the user's cache directory's
	// watermill-outbox/postgres.
	EnvCacheDir = "OUTBOX_POSTGRES_CACHE"
)

// FindBinDir returns the directory of the PostgreSQL server binaries to
// run: PG_BINDIR when set; else the installed PostgreSQL (pg_config
// --bindir, /usr/lib/postgresql/*/bin newest first, initdb on PATH), which
// is preferred when present; else the newest version fetched into the cache
// (CacheDir) before. ErrNoServerBinaries when there are none.
func FindBinDir() (string, error) {
	if d := os.Getenv(EnvBinDir); d != "" {
		if hasServer(d) {
			return d, nil
		}
		return "", fmt.Errorf("%w: %s=%s holds no initdb and postgres", ErrNoServerBinaries, EnvBinDir, d)
	}
	if d, err := SystemBinDir(); err == nil {
		return d, nil
	}
	if cache, err := CacheDir(); err == nil {
		if d, ok := CachedBinDir(cache, ""); ok {
			return d, nil
		}
	}
	return "", ErrNoServerBinaries
}

// SystemBinDir returns the directory of the PostgreSQL server installed on
// the machine (pg_config --bindir, /usr/lib/postgresql/*/bin newest first,
// initdb on PATH), or ErrNoServerBinaries, also when OUTBOX_POSTGRES_IGNORE_SYSTEM
// hides it.
func SystemBinDir() (string, error) {
	if os.Getenv(EnvIgnoreSystem) != "" {
		return "", ErrNoServerBinaries
	}
	var candidates []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	if versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(versions) > 0 {
		sort.Sort(sort.Reverse(sort.StringSlice(versions)))
		candidates = append(candidates, versions...)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	for _, d := range candidates {
		if hasServer(d) {
			return d, nil
		}
	}
	return "", ErrNoServerBinaries
}

// CacheDir is where fetched binaries are kept: OUTBOX_POSTGRES_CACHE, or
// watermill-outbox/postgres in the user's cache directory
// (os.UserCacheDir: $XDG_CACHE_HOME or ~/.cache on Linux). Version v's
// tree is CacheDir/v, with bin/initdb, bin/postgres, lib and share.
func CacheDir() (string, error) {
	if d := os.Getenv(EnvCacheDir); d != "" {
		return filepath.Abs(d)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("pgcluster: no cache directory for PostgreSQL binaries (set %s): %w", EnvCacheDir, err)
	}
	return filepath.Join(d, "watermill-outbox", "postgres"), nil
}

// CachedBinDir returns the bin directory of version in cache when a
// complete tree is there (one that a fetch finished: it is renamed into
// place whole). An empty version takes the newest one there.
func CachedBinDir(cache, version string) (string, bool) {
	if version != "" {
		d := filepath.Join(cache, version, "bin")
		return d, hasServer(d)
	}
	entries, err := os.ReadDir(cache)
	if err != nil {
		return "", false
	}
	var versions []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && hasServer(filepath.Join(cache, e.Name(), "bin")) {
			versions = append(versions, e.Name())
		}
	}
	if len(versions) == 0 {
		return "", false
	}
	sort.Slice(versions, func(i, j int) bool { return versionLess(versions[j], versions[i]) })
	return filepath.Join(cache, versions[0], "bin"), true
}

// versionLess orders dotted versions by their numbers ("9.6.24" before
// "15.13.0"), and names that are not versions by their text.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, errx := strconv.Atoi(as[i])
		y, erry := strconv.Atoi(bs[i])
		if errx != nil || erry != nil {
			return a < b
		}
		if x != y {
			return x < y
		}
	}
	return len(as) < len(bs)
}

func hasServer(dir string) bool {
	return isExec(filepath.Join(dir, "initdb")) && isExec(filepath.Join(dir, "postgres"))
}

// BinDir is the directory of the binaries the cluster runs.
func (c *Cluster) BinDir() string { return c.bindir }

// runnableAs returns a directory holding bindir's binaries that the user
// of cred can run, and what to call when the cluster no longer runs them.
// That is bindir itself, unless the user cannot reach it: a movable tree,
// such as one fetched into root's cache (~/.cache, under a home directory
// only root may enter), is then mirrored into a directory of the temporary
// directory that everyone may read (mirrorTree), which the clusters running
// it share and the last of them removes.
func runnableAs(ctx context.Context, bindir string, cred *syscall.Credential, movable bool) (string, func(), error) {
	probe := func(dir string) error {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, filepath.Join(dir, "postgres"), "--version")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	err := probe(bindir)
	if err == nil {
		return bindir, func() {}, nil
	}
	cache, cerr := CacheDir()
	tree := filepath.Dir(bindir)
	if !movable {
		movable = cerr == nil && within(cache, tree)
	}
	if !movable || filepath.Base(bindir) != "bin" {
		return "", nil, fmt.Errorf("pgcluster: as root the server runs as the postgres user, which cannot run %s/postgres (%v): make the directory readable to it, or set %s", bindir, err, EnvBinDir)
	}
	mirror, release, err := mirrorTree(ctx, tree)
	if err != nil {
		return "", nil, fmt.Errorf("pgcluster: as root the server runs as the postgres user, which cannot reach %s; copying it where it can: %w", tree, err)
	}
	bin := filepath.Join(mirror, "bin")
	if err := probe(bin); err != nil {
		release()
		return "", nil, fmt.Errorf("pgcluster: the postgres user cannot run %s/postgres either: %w", bin, err)
	}
	return bin, release, nil
}

// within reports whether path is dir or inside it.
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
