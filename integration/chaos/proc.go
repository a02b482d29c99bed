package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process that a chaos run starts, kills and starts again.
// Each incarnation runs in a process group of its own (so that a kill takes
// everything it started) and dies with the process that started it
// (Pdeathsig), and writes its output to a log file of its own.
type Proc struct {
	// Name names the process in logs and its log files.
	Name string
	// Role is the role it plays (several processes share one).
	Role string

	path   string
	args   []string
	env    []string
	logDir string

	mu          sync.Mutex
	pid         int
	running     bool
	exited      chan struct{}
	expectExit  bool // the exit in progress was asked for (Kill, Stop)
	incarnation int
	starts      int
	kills       int
	pauses      int
	selfExits   []string // how each exit nobody asked for ended
	lastExit    error    // how the last incarnation ended
	logFile     string
}

// NewProc describes a process that runs path with args and env (added to
// this process's environment), logging to files in logDir.
func NewProc(name, role, path string, args, env []string, logDir string) *Proc {
	return &Proc{Name: name, Role: role, path: path, args: args, env: env, logDir: logDir}
}

// Start starts an incarnation, unless one is running.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		return nil
	}
	p.incarnation++
	logFile := filepath.Join(p.logDir, fmt.Sprintf("%s.%d.log", p.Name, p.incarnation))
	f, err := os.Create(logFile)
	if err != nil {
		return err
	}
	type startResult struct {
		pid int
		err error
	}
	started := make(chan startResult, 1)
	exited := make(chan struct{})
	// The OS thread that starts the process stays locked until it exits,
	// so that Pdeathsig (sent when that thread ends) fires only when this
	// whole process ends.
	go func() {
		runtime.LockOSThread()
		defer f.Close()
		cmd := exec.Command(p.path, p.args...)
		cmd.Env = append(os.Environ(), p.env...)
		cmd.Stdout, cmd.Stderr = f, f
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			started <- startResult{err: err}
			close(exited)
			return
		}
		started <- startResult{pid: cmd.Process.Pid}
		err := cmd.Wait()
		// Whatever it started goes with it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		p.mu.Lock()
		p.running, p.lastExit = false, err
		if !p.expectExit {
			p.selfExits = append(p.selfExits, fmt.Sprintf("%s: %v (log %s)", time.Now().Format("15:04:05.000"), err, logFile))
		}
		p.expectExit = false
		p.mu.Unlock()
		close(exited)
	}()
	res := <-started
	if res.err != nil {
		return fmt.Errorf("start %s: %w", p.Name, res.err)
	}
	p.pid, p.running, p.exited, p.logFile = res.pid, true, exited, logFile
	p.expectExit = false
	p.starts++
	return nil
}

// Pid is the process id of the running incarnation (0 when none runs).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return 0
	}
	return p.pid
}

// Running reports whether an incarnation is running.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running
}

// Kill sends SIGKILL to the running incarnation's process group and waits
// for it to exit. It reports whether there was one to kill.
func (p *Proc) Kill() bool {
	p.mu.Lock()
	if !p.running {
		p.mu.Unlock()
		return false
	}
	p.expectExit = true
	p.kills++
	pid, exited := p.pid, p.exited
	p.mu.Unlock()
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-exited
	return true
}

// Pause stops the running incarnation's process group (SIGSTOP) for d and
// lets it go on (SIGCONT): a process that freezes (a long GC pause, a
// stalled VM) and wakes up as a zombie, after others took its leases over.
// It reports whether there was one to pause.
func (p *Proc) Pause(d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return p.PauseUntil(ctx)
}

// PauseUntil is Pause until ctx ends rather than for a fixed time.
func (p *Proc) PauseUntil(ctx context.Context) bool {
	p.mu.Lock()
	if !p.running {
		p.mu.Unlock()
		return false
	}
	p.pauses++
	pid, exited := p.pid, p.exited
	p.mu.Unlock()
	_ = syscall.Kill(-pid, syscall.SIGSTOP)
	select {
	case <-ctx.Done():
	case <-exited:
	}
	_ = syscall.Kill(-pid, syscall.SIGCONT)
	return true
}

// ErrKilled is returned by Stop when the process did not stop in time and
// was killed.
var ErrKilled = errors.New("did not stop in time: killed")

// Stop asks the running incarnation to stop (SIGTERM) and waits up to
// timeout for it to exit, then kills it (ErrKilled).
func (p *Proc) Stop(timeout time.Duration) error {
	p.mu.Lock()
	if !p.running {
		p.mu.Unlock()
		return nil
	}
	p.expectExit = true
	pid, exited := p.pid, p.exited
	p.mu.Unlock()
	_ = syscall.Kill(pid, syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-exited:
		p.mu.Lock()
		err := p.lastExit
		p.mu.Unlock()
		if err != nil {
			return fmt.Errorf("%s (log %s): stopped with %w", p.Name, p.LogFile(), err)
		}
		return nil
	case <-t.C:
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-exited
	return fmt.Errorf("%s (log %s): %w", p.Name, p.LogFile(), ErrKilled)
}

// LogFile is the log file of the current (or last) incarnation.
func (p *Proc) LogFile() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logFile
}

// ProcStats counts what happened to a Proc.
type ProcStats struct {
	Starts, Kills, Pauses int
	// SelfExits describes the exits nobody asked for.
	SelfExits []string
}

// Stats returns the Proc's counters.
func (p *Proc) Stats() ProcStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ProcStats{Starts: p.starts, Kills: p.kills, Pauses: p.pauses, SelfExits: append([]string(nil), p.selfExits...)}
}
