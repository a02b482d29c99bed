// Package pgcluster starts and stops throwaway PostgreSQL clusters from the
// server binaries installed on the machine. Tests, benchmarks and demos use it
// so that they need no database set up beforehand.
//
// A cluster lives in a fresh temporary directory, listens on 127.0.0.1 and a
// free port only, and is removed by Stop. When the current process runs as
// root, the server runs as the "postgres" user, because PostgreSQL refuses to
// run as root.
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
var ErrNoServerBinaries = errors.New("pgcluster: PostgreSQL server binaries (initdb, postgres) not found; install them (Debian: apt-get install postgresql) or set PG_BINDIR")

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
}

// Cluster is a running throwaway PostgreSQL server.
type Cluster struct {
	dir     string
	port    int
	bindir  string
	cred    *syscall.Credential
	cmd     *exec.Cmd
	exited  chan struct{}
	stopMu  sync.Mutex
	stopped bool
	sigStop func()
}

// Start initialises a cluster in a new temporary directory and starts it.
// The returned cluster must be stopped with Stop; Start also arranges for
// the cluster to be stopped when the process receives SIGINT or SIGTERM.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	bindir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outbox-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: temp dir: %w", err)
	}
	c := &Cluster{dir: dir, bindir: bindir, exited: make(chan struct{})}
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
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bindir, "initdb"),
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
		if err := c.spawn(args, logFile); err != nil {
			return err
		}
		if err := waitReady(ctx, port, c.exited); err == nil {
			c.port = port
			if opts.Log != nil {
				go tailLog(logFile, opts.Log, c.exited)
			}
			return nil
		} else {
			lastErr = err
			c.kill()
			log, _ := os.ReadFile(logFile)
			if !bytes.Contains(log, []byte("could not bind")) && !bytes.Contains(log, []byte("already in use")) {
				return fmt.Errorf("pgcluster: server did not start: %w: %s", err, bytes.TrimSpace(log))
			}
			c.exited = make(chan struct{})
		}
	}
	return fmt.Errorf("pgcluster: server did not start: %w", lastErr)
}

// spawn starts the postmaster from a goroutine whose OS thread stays locked
// for the server's whole life, so that Pdeathsig (sent when that thread dies)
// only fires when this process dies: a killed test binary takes its server
// with it instead of leaving it running.
func (c *Cluster) spawn(args []string, logFile string) error {
	started := make(chan error, 1)
	exited := c.exited
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
	return <-started
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

// Stop shuts the server down (fast mode) and removes its directory. It is
// safe to call more than once and from several goroutines.
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
	c.kill()
	_ = os.RemoveAll(c.dir)
}

// kill asks the postmaster for a fast shutdown and waits for it, escalating
// to an immediate shutdown and then SIGKILL if it takes too long.
func (c *Cluster) kill() {
	c.stopMu.Lock()
	cmd := c.cmd
	c.cmd = nil
	c.stopMu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-c.exited:
		return
	case <-time.After(10 * time.Second):
	}
	_ = cmd.Process.Signal(syscall.SIGQUIT) // immediate shutdown
	select {
	case <-c.exited:
		return
	case <-time.After(5 * time.Second):
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-c.exited
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

func findBinDir() (string, error) {
	var candidates []string
	if d := os.Getenv("PG_BINDIR"); d != "" {
		candidates = append(candidates, d)
	}
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
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", ErrNoServerBinaries
}

func isExec(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root needs a 'postgres' user to run the server as (it refuses root): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
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
