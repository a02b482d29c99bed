package sim

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Result is what one schedule did and found.
type Result struct {
	Seed      uint64
	Steps     int
	Published int
	Appended  int
	InKafka   int
	Dead      int // dead-lettered
	Kills     int
	Freezes   int
	Converted int // commits the client ended as aborts
	Crashes   int
	Outages   int
	// Combined counts the committed Kafka transactions that held records
	// of several outbox partitions (a round of the target's producer).
	Combined int
	// LegacyTakeovers counts the partitions of a world upgraded from a
	// version before writer records whose writer became known.
	LegacyTakeovers int
	// ForwardOnly: the topic was forwarder-only (internal/direct's loop
	// on pending, no log); Reconciled counts the messages a takeover found
	// in Kafka beyond a cursor and recorded forwarded.
	ForwardOnly bool
	Reconciled  int64
	Elapsed     time.Duration // simulated
	// Failures are the invariants broken; empty when the schedule passed.
	Failures []string
	// Trace is the schedule's trace (with Options.Trace).
	Trace string
}

// OK reports whether every invariant held.
func (r Result) OK() bool { return len(r.Failures) == 0 }

func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d steps, %d published, %d appended, %d in Kafka, %d dead-lettered, %d kills, %d freezes, %d converted commits, %d db crashes, %d kafka outages, %v simulated",
		r.Seed, r.Steps, r.Published, r.Appended, r.InKafka, r.Dead, r.Kills, r.Freezes, r.Converted, r.Crashes, r.Outages, r.Elapsed)
	if r.ForwardOnly {
		fmt.Fprintf(&b, "; forwarder-only topic, %d reconciled", r.Reconciled)
	}
	for _, f := range r.Failures {
		b.WriteString("\n  FAIL: " + f)
	}
	return b.String()
}

// Options tune a run.
type Options struct {
	// Trace records every step of the schedule in Result.Trace.
	Trace bool
	// NoConversion keeps the Kafka client from ending a commit as an
	// abort (to look for other faults).
	NoConversion bool
	// TrustEndTxn makes the Kafka driver report a commit whenever EndTxn
	// asked to commit returned nil, as the product's driver did before it
	// checked the broker's answer: the simulator must find the loss.
	TrustEndTxn bool
}

// Run runs the schedule of seed. It must run in a testing/synctest
// bubble (its clock is the bubble's).
func Run(seed uint64, opt Options) Result {
	var trace strings.Builder
	var tracef func(string, ...any)
	if opt.Trace {
		tracef = func(format string, args ...any) {
			fmt.Fprintf(&trace, "%12v ", time.Since(startOf))
			fmt.Fprintf(&trace, format, args...)
			trace.WriteByte('\n')
		}
	}
	s := newSim(seed, tracef)
	startOf = time.Now()
	w := newWorld(s, opt)
	res := Result{Seed: seed}
	w.res = &res
	w.chaos()
	w.drain()
	w.check()
	w.shutdown()
	res.Steps = s.steps
	res.Elapsed = time.Since(w.start)
	res.Failures = w.failures
	res.Trace = trace.String()
	return res
}

// startOf is the run's start, for the trace (one run per bubble).
var startOf time.Time

// chaos runs the storm: publishing, relaying, forwarding, faults.
func (w *world) chaos() {
	s := w.s
	for range w.sh.chaosActions {
		w.checkLeases()
		w.removeLeft()
		switch x := s.rng.Float64(); {
		case x < 0.08 && w.publishedCount() < w.sh.messages:
			// Sometimes a burst: the partitions then have batches at
			// once, and the target's rounds carry several.
			for n := 1 + w.s.intn(w.sh.burst); n > 0 && w.publishedCount() < w.sh.messages; n-- {
				w.publish()
			}
		case x < 0.19:
			w.advance(s.between(10*time.Millisecond, w.sh.ttl))
		case x < 0.22:
			if w.sh.foreign {
				w.foreignStep()
			}
		case x < 0.22+w.sh.kill:
			w.killSomething()
		case x < 0.22+w.sh.kill+w.sh.freeze:
			w.freezeSomething()
		case x < 0.22+w.sh.kill+w.sh.freeze+w.sh.join:
			if len(w.instances) < w.sh.maxInstances {
				s.trace("join")
				w.addInstance()
			}
		case x < 0.22+w.sh.kill+w.sh.freeze+w.sh.join+w.sh.leave:
			if w.s.chance(0.5) {
				w.restartSomething()
			} else if len(w.instances) > 1 {
				in := w.instances[w.s.intn(len(w.instances))]
				if !in.proc.dead.Load() && !in.leaving {
					s.trace("%s leaves", in.name)
					in.leaving = true
				}
			}
		case x < 0.22+w.sh.kill+w.sh.freeze+w.sh.join+w.sh.leave+w.sh.dbCrash:
			s.trace("database crash")
			w.res.Crashes++
			w.db.crash(s.between(0, 2*time.Second))
			for _, in := range w.instances {
				in.conn.abortAll()
			}
			w.wal.endAll()
		case x < 0.22+w.sh.kill+w.sh.freeze+w.sh.join+w.sh.leave+w.sh.dbCrash+w.sh.kafkaOutage:
			w.k.down = !w.k.down
			if w.k.down {
				w.res.Outages++
			}
			s.trace("kafka down: %v", w.k.down)
		default:
			w.runSomething(true)
		}
	}
}

// runSomething runs a process that can run (a forwarder or a relay):
// resumes one of its parked calls (with a fault, in a storm) or starts its
// next step. It reports whether anything ran.
func (w *world) runSomething(faults bool) bool {
	procs := make([]*proc, 0, len(w.instances)+len(w.relays))
	for _, in := range w.instances {
		procs = append(procs, in.proc)
	}
	for _, rp := range w.relays {
		procs = append(procs, rp.proc)
	}
	calls, steps := w.s.runnable(w.now(), procs)
	n := len(calls) + len(steps)
	if n == 0 {
		return false
	}
	k := w.s.intn(n)
	if k >= len(calls) {
		w.s.runStep(steps[k-len(calls)])
		return true
	}
	c := calls[k]
	o := answered
	if faults && w.storm && w.s.chance(w.sh.callFault) {
		o = [...]outcome{failBefore, failAfter, killBefore, killAfter}[w.s.intn(4)]
	}
	if o.kills() {
		w.res.Kills++
	}
	w.s.resume(c, o)
	if c.p.dead.Load() {
		for _, in := range w.instances {
			if in.proc == c.p {
				w.killInstance(in)
			}
		}
		for _, rp := range w.relays {
			if rp.proc == c.p {
				w.killRelay(rp)
			}
		}
	}
	return true
}

// advance moves the clock on by d (every goroutine waits meanwhile; the
// timers due fire), then lets the WAL writer flush and the Kafka
// coordinator time transactions out.
func (w *world) advance(d time.Duration) {
	w.s.trace("advance %v", d)
	time.Sleep(d)
	w.s.settle()
	w.db.flush()
	w.k.expire()
	// The server ends a stream whose holder said nothing for
	// wal_sender_timeout.
	if a := w.wal.active; a != nil && w.now().Sub(a.lastHeard) >= a.timeout {
		w.s.trace("the server ends %s's stream (silent for %v)", a.p.name, w.now().Sub(a.lastHeard))
		a.end()
	}
}

func (w *world) killSomething() {
	if len(w.relays) > 0 && w.s.chance(0.3) {
		rp := w.relays[w.s.intn(len(w.relays))]
		if !rp.proc.dead.Load() {
			w.res.Kills++
			w.killRelay(rp)
		}
		return
	}
	if len(w.instances) == 0 {
		return
	}
	in := w.instances[w.s.intn(len(w.instances))]
	if !in.proc.dead.Load() {
		w.res.Kills++
		w.killInstance(in)
	}
}

func (w *world) freezeSomething() {
	d := w.s.between(w.sh.ttl/2, 3*w.sh.ttl)
	w.res.Freezes++
	if len(w.relays) > 0 && w.s.chance(0.3) {
		rp := w.relays[w.s.intn(len(w.relays))]
		rp.proc.frozenUntil = w.now().Add(d)
		w.s.trace("%s frozen for %v", rp.name, d)
		return
	}
	if len(w.instances) == 0 {
		return
	}
	in := w.instances[w.s.intn(len(w.instances))]
	if w.s.chance(0.5) {
		// Most often, one in the middle of a Kafka request: a zombie's
		// send, the case fencing is for.
		var sending []*instance
		for _, x := range w.instances {
			for _, c := range w.s.calls(x.proc) {
				if strings.HasPrefix(c.role, "kafka") {
					sending = append(sending, x)
					break
				}
			}
		}
		if len(sending) > 0 {
			in = sending[w.s.intn(len(sending))]
		}
	}
	in.proc.frozenUntil = w.now().Add(d)
	w.s.trace("%s frozen for %v", in.name, d)
}

// restartSomething restarts a dead process (a forwarder as a new member,
// a relay as a standby).
func (w *world) restartSomething() {
	for _, rp := range w.relays {
		if rp.proc.dead.Load() {
			w.s.trace("%s restarts", rp.name)
			w.restartRelay(rp)
			return
		}
	}
	for _, in := range w.instances {
		if in.proc.dead.Load() {
			w.s.trace("%s restarts", in.name)
			w.restart(in)
			return
		}
	}
}

// drain stops the faults, brings everything back and runs until every
// committed message is appended and forwarded (or dead-lettered).
func (w *world) drain() {
	w.storm = false
	w.k.down = false
	now := w.now()
	if w.db.isDown() {
		w.advance(w.db.down.Sub(now))
	}
	for _, rp := range append([]*relayProc(nil), w.relays...) {
		rp.proc.frozenUntil = time.Time{}
		if rp.proc.dead.Load() {
			w.restartRelay(rp)
		}
	}
	for _, in := range w.instances {
		in.proc.frozenUntil = time.Time{}
	}
	for _, in := range append([]*instance(nil), w.instances...) {
		if in.proc.dead.Load() {
			w.restart(in)
		}
	}
	if len(w.instances) == 0 {
		w.addInstance()
	}
	w.commitOpen()
	for w.publishedCount() < w.sh.messages {
		w.publish()
		w.commitOpen()
	}
	const limit = 200000
	for i := 0; i < limit; i++ {
		if w.drained() {
			return
		}
		w.checkLeases()
		w.removeLeft()
		if len(w.instances) == 0 {
			w.addInstance()
		}
		switch {
		case w.s.chance(0.02):
			w.advance(w.s.between(10*time.Millisecond, w.sh.ttl))
		default:
			if !w.runSomething(false) {
				w.advance(w.s.between(10*time.Millisecond, w.sh.ttl/2))
			}
		}
	}
	w.fail("the world did not drain within %d steps (a stall):\n%s", limit, w.s.describe(w.now()))
}

// shutdown ends every goroutine of the schedule.
func (w *world) shutdown() {
	for _, p := range w.s.procs {
		if p.state != gone {
			w.s.stop(p)
		}
	}
	for _, in := range w.instances {
		_ = in.target.Close()
	}
}

func (w *world) fail(format string, args ...any) {
	w.failures = append(w.failures, fmt.Sprintf(format, args...))
}

// gapLogger is the processes' logger: it drops what they log, except an
// error that a model did not simulate (errNotSimulated), which fails the
// run once: the code under test took a path the models do not cover, and
// its retries would otherwise only show as a stall.
type gapLogger struct {
	watermill.NopLogger
	w *world
}

func (l gapLogger) Error(msg string, err error, _ watermill.LogFields) {
	if errors.Is(err, errNotSimulated) && !l.w.gap {
		l.w.gap = true
		l.w.fail("the code ran what the models do not simulate (%s): %v", msg, err)
	}
}

func (l gapLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }
