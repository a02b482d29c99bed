package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing/synctest"
	"time"
)

// outcome is how the scheduler ends a parked call.
type outcome int

const (
	answered   outcome = iota // the call takes effect and its answer arrives
	failBefore                // the connection fails before the call takes effect
	failAfter                 // the call takes effect, its answer is lost
	killBefore                // the process dies before the call takes effect
	killAfter                 // the call takes effect, the process dies before the answer
)

func (o outcome) String() string {
	return [...]string{"answered", "failBefore", "failAfter", "killBefore", "killAfter"}[o]
}

// applies reports whether the call takes effect.
func (o outcome) applies() bool { return o == answered || o == failAfter || o == killAfter }

// fails reports whether the caller gets an error instead of the answer.
func (o outcome) fails() bool { return o != answered }

// kills reports whether the process dies at the call.
func (o outcome) kills() bool { return o == killBefore || o == killAfter }

// errConnection is what a call the scheduler failed returns: the
// connection broke.
var errConnection = errors.New("sim: connection lost")

// proc is a simulated process: its real code runs on goroutines of its
// own — a step at a time, or a loop that runs until the process stops —
// and every goroutine parks at each call into a model.
type proc struct {
	s     *Sim
	name  string
	index int // in creation order: the scheduler's order among processes
	// step runs one step of the process (a lease manager round and a turn
	// of each partition, say), or its whole life (a relay's loop).
	step   func(ctx context.Context)
	ctx    context.Context
	cancel context.CancelFunc

	// dead is set when the process is killed: every later call of its
	// goroutines fails at once (they unwind; nothing they call takes
	// effect).
	dead atomic.Bool

	// Scheduler state, touched by the scheduler's goroutine while every
	// goroutine of the process is blocked.
	state       procState
	frozenUntil time.Time
	start       chan bool // starts a step (true) or ends the goroutine (false)
	stepDone    bool      // guarded by s.mu: the step returned
}

type procState int

const (
	idle    procState = iota // between steps
	running                  // in a step (its goroutines parked or waiting)
	gone                     // its goroutine ended
)

// call is a parked call of a goroutine of a process.
type call struct {
	p *proc
	// role names the goroutine (one parked call per role and process at a
	// time): "db", "kafka", "stream".
	role string
	op   string
	// ready says whether the call can go on (a lock it waits for is free);
	// nil: always.
	ready func() bool
	wake  chan outcome
}

// enter parks the calling goroutine of p, in role, at a model call op
// until the scheduler resumes it, and returns how the call ends. A dead
// process's calls fail at once. ready, if not nil, says when the call can
// go on.
func (p *proc) enter(role, op string, ready func() bool) outcome {
	if p.dead.Load() {
		return killBefore
	}
	c := &call{p: p, role: role, op: op, ready: ready, wake: make(chan outcome)}
	p.s.mu.Lock()
	p.s.parked = append(p.s.parked, c)
	p.s.mu.Unlock()
	o := <-c.wake
	if o.kills() {
		p.dead.Store(true)
	}
	return o
}

// loop is the process's main goroutine: a step each time the scheduler
// starts one.
func (p *proc) loop() {
	for <-p.start {
		p.step(p.ctx)
		p.s.mu.Lock()
		p.stepDone = true
		p.s.mu.Unlock()
	}
}

// Sim is one schedule: the seeded choices and the processes.
type Sim struct {
	seed  uint64
	rng   *rand.Rand
	procs []*proc
	trace func(format string, args ...any)
	// tracing: the trace is kept (call details are worth formatting).
	tracing bool
	steps   int

	mu     sync.Mutex
	parked []*call // guarded by mu
}

func newSim(seed uint64, trace func(string, ...any)) *Sim {
	tracing := trace != nil
	if trace == nil {
		trace = func(string, ...any) {}
	}
	return &Sim{seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), trace: trace, tracing: tracing}
}

// chance returns true with probability p.
func (s *Sim) chance(p float64) bool { return s.rng.Float64() < p }

// intn returns a number in [0, n).
func (s *Sim) intn(n int) int { return s.rng.IntN(n) }

// between returns a duration in [lo, hi].
func (s *Sim) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)+1))
}

// spawn starts a process whose steps run step.
func (s *Sim) spawn(name string, step func(ctx context.Context)) *proc {
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{s: s, name: name, index: len(s.procs), step: step, ctx: ctx, cancel: cancel, start: make(chan bool)}
	s.procs = append(s.procs, p)
	go p.loop()
	return p
}

// settle waits until every goroutine of the schedule is blocked — parked
// at a call, waiting for a step, a timer or another goroutine — and notes
// the steps that ended. Only then does the scheduler choose again: what
// runs between two choices is decided by the last one alone.
func (s *Sim) settle() {
	synctest.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		if p.stepDone {
			p.stepDone = false
			if p.state == running {
				p.state = idle
			}
		}
	}
}

// calls returns p's parked calls, by role.
func (s *Sim) calls(p *proc) []*call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*call
	for _, c := range s.parked {
		if c.p == p {
			out = append(out, c)
		}
	}
	sortStable(out, func(a, b *call) bool { return a.role < b.role })
	return out
}

// runStep starts a step of an idle process and runs it until everything
// is blocked again.
func (s *Sim) runStep(p *proc) {
	s.steps++
	p.state = running
	p.start <- true
	s.settle()
}

// resume ends parked call c with o and runs until everything is blocked
// again.
func (s *Sim) resume(c *call, o outcome) {
	s.steps++
	s.trace("%s %s: %s", c.p.name, c.op, o)
	s.mu.Lock()
	for i, x := range s.parked {
		if x == c {
			s.parked = append(s.parked[:i], s.parked[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	c.wake <- o
	s.settle()
}

// kill kills p: its parked calls fail at once and every later call of its
// goroutines too, until they unwind; its context ends.
func (s *Sim) kill(p *proc) {
	p.cancel() // (a process a call killed is dead already, its context not ended yet)
	if p.dead.Load() && len(s.calls(p)) == 0 {
		s.settle()
		return
	}
	s.trace("%s killed", p.name)
	p.dead.Store(true)
	for _, c := range s.calls(p) {
		s.resume(c, killBefore)
	}
	s.settle()
}

// stop ends p's goroutines: it kills p and waits for its step to end (a
// goroutine waiting for a timer gets it: the clock moves on).
func (s *Sim) stop(p *proc) {
	s.kill(p)
	for i := 0; p.state == running; i++ {
		for _, c := range s.calls(p) {
			s.resume(c, killBefore)
		}
		if p.state == running {
			if i > 1000 {
				panic(fmt.Sprintf("sim: seed %d: %s does not stop:\n%s", s.seed, p.name, s.describe(time.Now())))
			}
			time.Sleep(time.Second)
			s.settle()
		}
	}
	if p.state == idle {
		p.state = gone
		p.start <- false
		s.settle()
	}
}

// runnable returns the calls and idle processes the scheduler may run
// now, in a fixed order (by process, then role).
func (s *Sim) runnable(now time.Time, ps []*proc) (calls []*call, steps []*proc) {
	for _, p := range ps {
		if p.dead.Load() || p.state == gone || now.Before(p.frozenUntil) {
			continue
		}
		if p.state == idle {
			steps = append(steps, p)
			continue
		}
		for _, c := range s.calls(p) {
			if c.ready == nil || c.ready() {
				calls = append(calls, c)
			}
		}
	}
	return calls, steps
}

// describe is the state of every process, for a failure's report.
func (s *Sim) describe(now time.Time) string {
	var b strings.Builder
	for _, p := range s.procs {
		st := [...]string{"idle", "running", "gone"}[p.state]
		for _, c := range s.calls(p) {
			st += ", parked at " + c.op
		}
		if p.dead.Load() {
			st += ", dead"
		}
		if now.Before(p.frozenUntil) {
			st += fmt.Sprintf(", frozen for %v", p.frozenUntil.Sub(now))
		}
		fmt.Fprintf(&b, "  %s: %s\n", p.name, st)
	}
	return b.String()
}

// detail returns op with the details format gives, when the schedule is
// traced (op alone otherwise: formatting costs).
func (s *Sim) detail(op, format string, args ...any) string {
	if !s.tracing {
		return op
	}
	return op + " " + fmt.Sprintf(format, args...)
}

type roleKey struct{}

// withRole returns ctx naming the role of the goroutine that calls with
// it: a process's goroutines that run at once (its Workers' turns) park
// under roles of their own, so that the scheduler orders their calls the
// same way each run.
func withRole(ctx context.Context, role string) context.Context {
	return context.WithValue(ctx, roleKey{}, role)
}

// roleOf returns the role ctx names, as a suffix of kind ("db/p3"), or
// kind alone.
func roleOf(ctx context.Context, kind string) string {
	if ctx == nil {
		return kind
	}
	if r, ok := ctx.Value(roleKey{}).(string); ok {
		return kind + "/" + r
	}
	return kind
}
