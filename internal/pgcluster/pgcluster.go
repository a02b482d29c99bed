// Package pgcluster starts and stops throwaway PostgreSQL clusters from the
// server binaries installed on the machine, or from binaries fetched before
// into the user's cache (see FindBinDir). Tests, benchmarks and demos use it
// so that they need no database set up beforehand.
//
// Fetching is not done here: the fetcher (module
// github.com/millrace/watermill-outbox/pgtemp) depends on
// github.com/fergusstrange/embedded-postgres, which the library module must
// not require. This package only knows the cache's layout (CacheDir), so
// that the library's own tests find what a fetch put there.
//
// A cluster lives in a fresh temporary directory, listens on 127.0.0.1 and a
// free port only, and is removed by Stop. When the current process runs as
// root, the server runs as the "postgres" user (or "nobody" where there is
// none), because PostgreSQL refuses to run as root.
//
// Restart stops the server (fast, or immediate: a crash as far as the data
// is concerned) and starts it again on the same data directory and port, for
// tests of what clients do when their database goes away under them.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoServerBinaries is returned when no PostgreSQL server binaries
// (initdb, pg_ctl, postgres) can be found.
var ErrNoServerBinaries = errors.New("pgcluster: PostgreSQL server binaries (initdb, postgres) not found, neither installed nor in the cache; install them (Debian: apt-get install postgresql), set PG_BINDIR, or let the tests fetch them (module github.com/millrace/watermill-outbox/pgtemp)")

// Options tune a throwaway cluster.
type Options struct {
	// Durable keeps fsync and synchronous_commit on (benchmarks that must
	// measure the real cost of a commit). The default turns both off, as
	// tests want speed, not durability.
	Durable bool
	// Settings are extra server settings passed as -c name=value.
	Settings map[string]string
	// Log receives the server's log output; nil discards it.
	Log func(line string)
	// BinDir is the directory of the initdb and postgres to run. Empty:
	// FindBinDir's.
	BinDir string
	// Movable says that BinDir's parent is a tree that works wherever it
	// is (bin, lib and share together, as fetched binaries are), so that
	// as root it may be copied where the postgres user can reach it. Trees
	// in CacheDir are taken to be.
	Movable bool
}

// Cluster is a running throwaway PostgreSQL server.
type Cluster struct {
	dir     string
	port    int
	bindir  string
	cred    *syscall.Credential
	args    []string // the postgres command line of the running server
	logFile string
	done    chan struct{} // closed by Stop: ends the log tail
	release func()        // gives back the mirror of the binaries, if any (runnableAs); nil: none

	// lifeMu serializes Stop and Restart, so that a server is never
	// started again after (or while) the cluster is stopped.
	lifeMu sync.Mutex

	stopMu   sync.Mutex // guards cmd, exited, stopped and restarts
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the current server process exits
	stopped  bool
	restarts int
	sigStop  func()
}

// Start initialises a cluster in a new temporary directory and starts it.
// The returned cluster must be stopped with Stop; Start also arranges for
// the cluster to be stopped when the process receives SIGINT or SIGTERM.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	bindir := opts.BinDir
	if bindir == "" {
		if bindir, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if !hasServer(bindir) {
		return nil, fmt.Errorf("%w: no initdb and postgres in %s", ErrNoServerBinaries, bindir)
	}
	dir, err := os.MkdirTemp("", "outbox-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: temp dir: %w", err)
	}
	c := &Cluster{dir: dir, bindir: bindir, exited: make(chan struct{}), done: make(chan struct{})}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			return nil, err
		}
		c.cred = cred
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgcluster: chown %s: %w", dir, err)
		}
		if c.bindir, c.release, err = runnableAs(ctx, bindir, cred, opts.Movable); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(c.bindir, "initdb"),
		"--pgdata="+data, "--username=postgres", "--auth=trust", "--encoding=UTF8",
		"--locale=C", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgcluster: initdb: %w: %s", err, bytes.TrimSpace(out))
	}
	if err := c.startServer(ctx, data, opts); err != nil {
		return nil, err
	}
	c.sigStop = stopOnSignal(c)
	return c, nil
}

func (c *Cluster) startServer(ctx context.Context, data string, opts Options) error {
	settings := map[string]string{
		"listen_addresses":                    "127.0.0.1",
		"unix_socket_directories":             c.dir,
		"max_connections":                     "300",
		"shared_buffers":                      "256MB",
		"max_wal_size":                        "4GB",
		"checkpoint_timeout":                  "30min",
		"log_min_messages":                    "warning",
		"logging_collector":                   "off",
		"max_locks_per_transaction":           "256",
		"autovacuum_naptime":                  "5s",
		"idle_in_transaction_session_timeout": "0",
	}
	if !opts.Durable {
		settings["fsync"] = "off"
		settings["synchronous_commit"] = "off"
		settings["full_page_writes"] = "off"
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	// A free port can be taken by someone else between probing and binding;
	// retry a few times with a new one.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		args := []string{"-D", data, "-p", strconv.Itoa(port)}
		keys := make([]string, 0, len(settings))
		for k := range settings {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			args = append(args, "-c", k+"="+settings[k])
		}
		logFile := filepath.Join(c.dir, "server.log")
		exited, err := c.spawn(args, logFile)
		if err != nil {
			return err
		}
		if err := waitReady(ctx, port, exited); err == nil {
			c.port, c.args, c.logFile = port, args, logFile
			if opts.Log != nil {
				go tailLog(logFile, opts.Log, c.done)
			}
			return nil
		} else {
			lastErr = err
			c.kill()
			log, _ := os.ReadFile(logFile)
			if !bytes.Contains(log, []byte("could not bind")) && !bytes.Contains(log, []byte("already in use")) {
				return fmt.Errorf("pgcluster: server did not start: %w: %s", err, bytes.TrimSpace(log))
			}
		}
	}
	return fmt.Errorf("pgcluster: server did not start: %w", lastErr)
}

// spawn starts the postmaster from a goroutine whose OS thread stays locked
// for the server's whole life, so that Pdeathsig (sent when that thread dies)
// only fires when this process dies: a killed test binary takes its server
// with it instead of leaving it running. It returns the channel closed when
// this server process exits (also c.exited from now on).
func (c *Cluster) spawn(args []string, logFile string) (<-chan struct{}, error) {
	started := make(chan error, 1)
	exited := make(chan struct{})
	c.stopMu.Lock()
	c.exited = exited
	c.stopMu.Unlock()
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread exits with the goroutine, after the
		// server has exited, which is the point.
		f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			started <- err
			close(exited)
			return
		}
		defer f.Close()
		cmd := exec.Command(filepath.Join(c.bindir, "postgres"), args...)
		cmd.Stdout, cmd.Stderr = f, f
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("pgcluster: start postgres: %w", err)
			close(exited)
			return
		}
		c.stopMu.Lock()
		c.cmd = cmd
		c.stopMu.Unlock()
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	return exited, <-started
}

// Port is the TCP port the server listens on (on 127.0.0.1).
func (c *Cluster) Port() int { return c.port }

// URL returns a connection string for database db (postgres when empty).
func (c *Cluster) URL(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// Stop shuts the server down (fast mode) and removes its directory, and the
// copy of its binaries made for it as root when no other cluster runs that
// copy any more. It is safe to call more than once and from several
// goroutines; a Restart in progress finishes first.
func (c *Cluster) Stop() {
	c.stopMu.Lock()
	if c.stopped {
		c.stopMu.Unlock()
		return
	}
	c.stopped = true
	sigStop := c.sigStop
	c.stopMu.Unlock()
	if sigStop != nil {
		sigStop()
	}
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	c.kill()
	if c.done != nil {
		close(c.done)
	}
	_ = os.RemoveAll(c.dir)
	if c.release != nil {
		c.release() // after the server: its binaries may go now
	}
}

// ShutdownMode says how Restart stops the server.
type ShutdownMode int

const (
	// Fast disconnects the clients, rolls back their transactions and
	// shuts down cleanly (a checkpoint): pg_ctl stop -m fast.
	Fast ShutdownMode = iota
	// Immediate makes every server process quit at once, without a
	// checkpoint: pg_ctl stop -m immediate. The next start runs crash
	// recovery from the WAL, as after a power cut of the server alone
	// (the operating system keeps what was written, so even without fsync
	// every commit that was acknowledged survives, unless
	// synchronous_commit is off).
	Immediate
)

func (m ShutdownMode) String() string {
	switch m {
	case Fast:
		return "fast"
	case Immediate:
		return "immediate"
	}
	return "ShutdownMode(" + strconv.Itoa(int(m)) + ")"
}

// RestartOptions tune Restart.
type RestartOptions struct {
	// Mode is how the server is stopped (Fast when zero).
	Mode ShutdownMode
	// Down is how long the server stays down before it is started again:
	// clients that connect meanwhile are refused.
	Down time.Duration
}

// ErrStopped is returned by Restart on a cluster that was stopped.
var ErrStopped = errors.New("pgcluster: cluster stopped")

// Restart stops the server as opts.Mode says, waits opts.Down, and starts
// it again on the same data directory, port and settings. Every client
// connection breaks; the clients must reconnect. It returns when the
// server accepts connections again (crash recovery included), or with an
// error when it cannot be started again, in which case the cluster is left
// down (Stop still cleans up). Restarts of one cluster are serialized, and
// Stop waits for one in progress.
func (c *Cluster) Restart(ctx context.Context, opts RestartOptions) error {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	c.stopMu.Lock()
	stopped := c.stopped
	c.stopMu.Unlock()
	if stopped {
		return ErrStopped
	}
	switch opts.Mode {
	case Fast:
		c.kill()
	case Immediate:
		c.killImmediate()
	default:
		return fmt.Errorf("pgcluster: unknown shutdown mode %v", opts.Mode)
	}
	if opts.Down > 0 {
		t := time.NewTimer(opts.Down)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	// The port was ours a moment ago; a socket of the old server may still
	// be on its way out, so retry a bind failure for a while.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("pgcluster: restart: %w", err)
		}
		exited, err := c.spawn(c.args, c.logFile)
		if err != nil {
			return err
		}
		err = waitReady(ctx, c.port, exited)
		if err == nil {
			c.stopMu.Lock()
			c.restarts++
			c.stopMu.Unlock()
			return nil
		}
		c.kill()
		log, _ := os.ReadFile(c.logFile)
		bind := bytes.Contains(log, []byte("could not bind")) || bytes.Contains(log, []byte("already in use"))
		if !bind || time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: restart: server did not start: %w: %s", err, lastLines(log, 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Restarts counts the successful restarts of the cluster.
func (c *Cluster) Restarts() int {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	return c.restarts
}

// lastLines returns the last n lines of log.
func lastLines(log []byte, n int) []byte {
	lines := bytes.Split(bytes.TrimSpace(log), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return bytes.Join(lines, []byte("\n"))
}

// kill asks the postmaster for a fast shutdown and waits for it, escalating
// to an immediate shutdown and then SIGKILL if it takes too long.
func (c *Cluster) kill() {
	c.stopMu.Lock()
	cmd, exited := c.cmd, c.exited
	c.cmd = nil
	c.stopMu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-exited:
		return
	case <-time.After(10 * time.Second):
	}
	stopImmediately(cmd, exited)
}

// killImmediate asks the postmaster for an immediate shutdown (SIGQUIT: its
// children quit at once, no checkpoint) and waits for it, escalating to
// SIGKILL if it takes too long.
func (c *Cluster) killImmediate() {
	c.stopMu.Lock()
	cmd, exited := c.cmd, c.exited
	c.cmd = nil
	c.stopMu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	stopImmediately(cmd, exited)
}

func stopImmediately(cmd *exec.Cmd, exited <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGQUIT) // immediate shutdown
	select {
	case <-exited:
		return
	case <-time.After(5 * time.Second):
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

var (
	signalMu       sync.Mutex
	signalClusters = map[*Cluster]struct{}{}
	signalOnce     sync.Once
)

// stopOnSignal registers c to be stopped on SIGINT/SIGTERM; the process then
// exits with status 130 (like an interrupted shell command).
func stopOnSignal(c *Cluster) func() {
	signalOnce.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
		go func() {
			<-ch
			signalMu.Lock()
			list := make([]*Cluster, 0, len(signalClusters))
			for cl := range signalClusters {
				list = append(list, cl)
			}
			signalMu.Unlock()
			for _, cl := range list {
				cl.Stop()
			}
			os.Exit(130)
		}()
	})
	signalMu.Lock()
	signalClusters[c] = struct{}{}
	signalMu.Unlock()
	return func() {
		signalMu.Lock()
		delete(signalClusters, c)
		signalMu.Unlock()
	}
}

func isExec(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// serverUsers are the users a server started by root runs as, the first
// that exists: "postgres", which Debian's package creates, else "nobody",
// which every Linux has, so that root on a machine with Go only (a
// container) runs fetched binaries too.
var serverUsers = []string{"postgres", "nobody"}

func postgresCredential() (*syscall.Credential, error) {
	var errs []error
	for _, name := range serverUsers {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("pgcluster: running as root needs a user to run the server as (it refuses root), one of %v: %w", serverUsers, errors.Join(errs...))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func waitReady(ctx context.Context, port int, exited <-chan struct{}) error {
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port)
	deadline := time.Now().Add(60 * time.Second)
	var lastErr error = errors.New("timed out waiting for server")
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("server exited")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, url)
		if err == nil {
			err = conn.Ping(cctx)
			_ = conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	return lastErr
}

func tailLog(path string, logf func(string), done <-chan struct{}) {
	var offset int64
	for {
		select {
		case <-done:
			return
		case <-time.After(200 * time.Millisecond):
		}
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		_, _ = f.Seek(offset, 0)
		buf := new(bytes.Buffer)
		n, _ := buf.ReadFrom(f)
		f.Close()
		offset += n
		for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
			if line != "" {
				logf(line)
			}
		}
	}
}
