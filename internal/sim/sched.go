package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
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
// own, one step at a time, and parks at every call into a model.
type proc struct {
	s    *Sim
	name string
	// step runs one step of the process (a lease manager round and a turn
	// of each partition, say); nil for a process the scheduler runs itself.
	step func(ctx context.Context)
	ctx  context.Context

	// Scheduler state, touched only by the scheduler's goroutine and the
	// process's goroutine while the other waits for it.
	state       procState
	dead        bool
	frozenUntil time.Time
	parked      *call
	wake        chan outcome // resumes a parked call
	start       chan bool    // starts a step (true) or ends the goroutine (false)
}

type procState int

const (
	idle    procState = iota // between steps
	running                  // in a step, not parked
	parked                   // in a step, parked at a call
	gone                     // its goroutine ended
)

// call is a parked call of a process.
type call struct {
	op string
	// ready says whether the call can go on (a row lock it waits for is
	// free); nil: always.
	ready func() bool
}

// event is what a process's goroutine tells the scheduler: it parked at a
// call, or its step ended.
type event struct {
	p      *proc
	parked *call
}

// enter parks the calling goroutine of p at a model call op until the
// scheduler resumes it, and returns how the call ends. A dead process's
// calls fail at once. ready, if not nil, says when the call can go on.
func (p *proc) enter(op string, ready func() bool) outcome {
	if p.dead {
		return killBefore
	}
	c := &call{op: op, ready: ready}
	p.s.events <- event{p: p, parked: c}
	o := <-p.wake
	if o.kills() {
		p.dead = true
	}
	return o
}

// loop is the process's goroutine: a step each time the scheduler starts
// one.
func (p *proc) loop() {
	for <-p.start {
		p.step(p.ctx)
		p.s.events <- event{p: p}
	}
	p.s.events <- event{p: p}
}

// Sim is one schedule: the seeded choices and the processes.
type Sim struct {
	seed   uint64
	rng    *rand.Rand
	events chan event
	procs  []*proc
	trace  func(format string, args ...any)
	// tracing: the trace is kept (call details are worth formatting).
	tracing bool
	steps   int
}

func newSim(seed uint64, trace func(string, ...any)) *Sim {
	tracing := trace != nil
	if trace == nil {
		trace = func(string, ...any) {}
	}
	return &Sim{seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), events: make(chan event), trace: trace, tracing: tracing}
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
	p := &proc{s: s, name: name, step: step, ctx: context.Background(), wake: make(chan outcome), start: make(chan bool)}
	s.procs = append(s.procs, p)
	go p.loop()
	return p
}

// wait waits for p's next event, which must be p's: the process runs
// alone until it parks or its step ends.
func (s *Sim) wait(p *proc) {
	ev := <-s.events
	if ev.p != p {
		panic(fmt.Sprintf("sim: seed %d: %s ran while %s was scheduled", s.seed, ev.p.name, p.name))
	}
	if ev.parked != nil {
		p.state, p.parked = parked, ev.parked
		return
	}
	p.parked = nil
	if p.state == gone {
		return
	}
	p.state = idle
}

// runStep starts a step of an idle process and runs it up to its first
// call (or its end).
func (s *Sim) runStep(p *proc) {
	s.steps++
	p.state = running
	p.start <- true
	s.wait(p)
}

// resume ends p's parked call with o and runs p up to its next call (or
// the end of its step).
func (s *Sim) resume(p *proc, o outcome) {
	s.steps++
	s.trace("%s %s: %s", p.name, p.parked.op, o)
	p.state, p.parked = running, nil
	p.wake <- o
	s.wait(p)
}

// kill kills p: a parked call fails at once and every later call of its
// goroutine too, until its step unwinds; an idle process just dies.
func (s *Sim) kill(p *proc) {
	if p.dead {
		return
	}
	s.trace("%s killed", p.name)
	if p.state == parked {
		s.resume(p, killBefore)
		return
	}
	p.dead = true
}

// stop ends p's goroutine (p is idle or dead and idle).
func (s *Sim) stop(p *proc) {
	for p.state == parked {
		s.resume(p, killBefore)
	}
	if p.state == gone {
		return
	}
	p.state = gone
	p.start <- false
	s.wait(p)
}

// canRun reports whether p may be scheduled now.
func (p *proc) canRun(now time.Time) bool {
	if p.dead || p.state == gone || now.Before(p.frozenUntil) {
		return false
	}
	if p.state == parked {
		return p.parked.ready == nil || p.parked.ready()
	}
	return p.state == idle
}

// detail returns op with the details format gives, when the schedule is
// traced (op alone otherwise: formatting costs).
func (s *Sim) detail(op, format string, args ...any) string {
	if !s.tracing {
		return op
	}
	return op + " " + fmt.Sprintf(format, args...)
}

// describe is the state of every process, for a failure's report.
func (s *Sim) describe(now time.Time) string {
	var b strings.Builder
	for _, p := range s.procs {
		st := [...]string{"idle", "running", "parked", "gone"}[p.state]
		if p.state == parked {
			st += " at " + p.parked.op
		}
		if p.dead {
			st += ", dead"
		}
		if now.Before(p.frozenUntil) {
			st += fmt.Sprintf(", frozen for %v", p.frozenUntil.Sub(now))
		}
		fmt.Fprintf(&b, "  %s: %s\n", p.name, st)
	}
	return b.String()
}
