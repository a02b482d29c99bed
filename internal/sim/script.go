package sim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/millrace/watermill-outbox/partitioning"
)

// Scripted schedules: a test drives the world through a given sequence
// (freeze this instance while it commits, kill that one while it fences,
// …) to make a case happen that random schedules reach only by luck, and
// the invariants are checked as after any schedule. The scheduler still
// draws everything the script leaves open, from the seed.

// script drives a world.
type script struct {
	w   *world
	err error // the first step that could not be made to happen
}

// scriptShape is the world of a script: calm (no faults but those the
// script makes), one forwarder to start with.
func scriptShape(partitions int) shape {
	return shape{
		partitions: partitions, kafkaPartitions: partitions,
		instances: 1, maxInstances: 4,
		messages: 0, keys: 8, batch: 10,
		ttl: time.Second,
	}
}

// runScript runs script on a world of sh from seed, then drains it and
// checks the invariants. It must run in a testing/synctest bubble.
func runScript(seed uint64, sh shape, opt Options, play func(sc *script)) Result {
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
	w := &world{s: s, start: time.Now(), sh: sh, trustEnd: opt.TrustEndTxn}
	w.populate()
	res := Result{Seed: seed}
	w.res = &res
	w.storm = false
	sc := &script{w: w}
	play(sc)
	// The frozen wake up and finish the step they were in before the
	// drain (which would end at once if the others forwarded everything).
	var woken []*instance
	for _, in := range w.instances {
		if !in.proc.frozenUntil.IsZero() {
			in.proc.frozenUntil = time.Time{}
			woken = append(woken, in)
		}
	}
	sc.until("the woken finished their steps", func() bool {
		for _, in := range woken {
			if !in.proc.dead.Load() && in.proc.state == running {
				return false
			}
		}
		return true
	}, nil)
	if sc.err != nil {
		w.fail("the script could not go on: %v", sc.err)
	} else {
		w.sh.messages = w.publishedCount()
		w.drain()
		w.check()
	}
	w.shutdown()
	res.Steps = s.steps
	res.Elapsed = time.Since(w.start)
	res.Failures = w.failures
	res.Trace = trace.String()
	return res
}

// scriptLimit bounds the steps of one script step.
const scriptLimit = 20000

// until runs the world (every process but those excluded, whose calls
// match skip) until cond holds.
func (sc *script) until(what string, cond func() bool, skip func(c *call) bool) {
	if sc.err != nil {
		return
	}
	w := sc.w
	for range scriptLimit {
		if cond() {
			w.s.trace("script: %s", what)
			return
		}
		w.checkLeases()
		if !w.runSome(skip) || w.s.chance(0.02) {
			w.advance(w.s.between(10*time.Millisecond, w.sh.ttl/4))
		}
	}
	sc.err = fmt.Errorf("%s: not within %d steps:\n%s", what, scriptLimit, w.s.describe(w.now()))
}

// runSome runs one call or step, as runSomething does without faults,
// but never a call skip matches (nil: none).
func (w *world) runSome(skip func(c *call) bool) bool {
	procs := make([]*proc, 0, len(w.instances)+len(w.relays))
	for _, in := range w.instances {
		procs = append(procs, in.proc)
	}
	for _, rp := range w.relays {
		procs = append(procs, rp.proc)
	}
	calls, steps := w.s.runnable(w.now(), procs)
	if skip != nil {
		calls = filter(calls, func(c *call) bool { return !skip(c) })
		// A step starts turns of every partition: none while some of
		// the process's calls are held back.
		steps = filter(steps, func(p *proc) bool { return !skip(&call{p: p, role: "step"}) })
	}
	n := len(calls) + len(steps)
	if n == 0 {
		return false
	}
	k := w.s.intn(n)
	if k >= len(calls) {
		w.s.runStep(steps[k-len(calls)])
		return true
	}
	w.s.resume(calls[k], answered)
	return true
}

func filter[T any](xs []T, keep func(T) bool) []T {
	var out []T
	for _, x := range xs {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

// parked returns in's parked call whose role and op start with role and
// op, or nil.
func (sc *script) parked(in *instance, role, op string) *call {
	for _, c := range sc.w.s.calls(in.proc) {
		if strings.HasPrefix(c.role, role) && strings.HasPrefix(c.op, op) {
			return c
		}
	}
	return nil
}

// publishTo publishes until every partition of parts has at least n more
// messages committed.
func (sc *script) publishTo(n int, parts ...int) {
	w := sc.w
	count := func(p int) int {
		c := 0
		for _, t := range w.published {
			for _, m := range t.msgs {
				if m.partition == p {
					c++
				}
			}
		}
		return c
	}
	want := map[int]int{}
	for _, p := range parts {
		want[p] = count(p) + n
	}
	for range 1000 {
		done := true
		for _, p := range parts {
			if count(p) < want[p] {
				done = false
			}
		}
		if done {
			return
		}
		w.publish()
	}
	sc.err = fmt.Errorf("publishing to partitions %v: no luck", parts)
}

// appended reports whether the log holds every message committed.
func (sc *script) appended() bool { return sc.w.wal.appended() }

// forwarded reports whether partition p's cursor stands at its last seq.
func (sc *script) forwarded(p int) bool {
	r := sc.w.db.cursors[cursorKey{group, topic, p}]
	return r != nil && r.seq == sc.w.db.lastSeq(tp{topic, p}) && r.seq > 0
}

// holds reports whether in holds partition p.
func (sc *script) holds(in *instance, p int) bool {
	for _, h := range in.mgr.Held() {
		if h == p {
			return true
		}
	}
	return false
}

// of matches the calls of in.
func of(in *instance) func(c *call) bool {
	return func(c *call) bool { return c.p == in.proc }
}

// transactionalID is the transactional id of in's target.
func transactionalID(in *instance) string { return "sim/" + in.name }

// freeze freezes in for d.
func (sc *script) freeze(in *instance, d time.Duration) {
	in.proc.frozenUntil = sc.w.now().Add(d)
	sc.w.res.Freezes++
	sc.w.s.trace("script: %s frozen for %v", in.name, d)
}

// killAt kills in at its parked call c, before c takes effect.
func (sc *script) killAt(in *instance, c *call) {
	sc.w.res.Kills++
	sc.w.s.resume(c, killBefore)
	sc.w.killInstance(in)
}

// ScenarioFenceBeforeRecord: a takeover fences the partition's last
// writer before it records itself, so that a takeover that dies in
// between leaves the writer to fence to the next one. Forwarder I freezes
// while it commits a batch of partition 0; J takes the partition over and
// dies as it fences I; K takes it over and forwards it; I wakes up and
// commits. K must have fenced I (I's commit fails): had J recorded itself
// first, K would fence J only, and I's commit would copy the batch.
func scenarioFenceBeforeRecord(sc *script) {
	w := sc.w
	i := w.instances[0]
	sc.publishTo(3, 0)
	sc.until("I commits a batch", func() bool { return sc.parked(i, "kafka", "kafka.end_txn") != nil }, nil)
	sc.freeze(i, 8*time.Second)
	j := w.addInstance()
	var fence *call
	sc.until("J fences I", func() bool {
		fence = sc.parked(j, "kafka", "kafka.init_producer_id "+transactionalID(i))
		return fence != nil
	}, nil)
	if sc.err != nil {
		return
	}
	sc.killAt(j, fence)
	k := w.addInstance()
	sc.until("K forwarded partition 0", func() bool { return sc.holds(k, 0) && sc.forwarded(0) }, nil)
}

// ScenarioTakeOverAfterEachStart: after its producer starts again, a
// target takes each partition over again before it sends for it, which
// checks the lease. Forwarder I forwards partitions 0 and 1; it freezes
// while it commits one transaction holding batches of both; J takes both
// partitions over (fencing I) and forwards them; I wakes up: its commit
// fails, and the batches are sent again alone: the producer starts again
// for the first, and the second must not go out under that start without
// its lease, which J holds now.
func scenarioTakeOverAfterEachStart(sc *script) {
	w := sc.w
	i := w.instances[0]
	sc.publishTo(2, 0, 1)
	sc.until("I forwarded both partitions", func() bool { return sc.forwarded(0) && sc.forwarded(1) }, nil)
	sc.publishTo(2, 0, 1)
	sc.until("the log holds them", sc.appended, of(i))
	// Partition 0's batch waits for others (Linger); partition 1's turn
	// starts then, and its batch joins the round.
	sc.until("partition 0's batch waits for a round", func() bool { return sc.sending(i, 0) }, func(c *call) bool { return c.p == i.proc && c.role == "turn/p1" })
	sc.until("partition 1's batch joins it", func() bool { return sc.sending(i, 1) }, func(c *call) bool { return c.p == i.proc && c.role == "turn/p0" })
	sc.until("I commits a transaction of both", func() bool {
		st := w.k.ids[transactionalID(i)]
		return sc.parked(i, "kafka", "kafka.end_txn") != nil && st != nil && st.cur != nil && len(st.cur.parts) == 2
	}, nil)
	sc.freeze(i, 8*time.Second)
	j := w.addInstance()
	sc.until("J forwarded both partitions", func() bool {
		return sc.holds(j, 0) && sc.holds(j, 1) && sc.forwarded(0) && sc.forwarded(1)
	}, nil)
}

// sending reports whether in's Worker of partition p has a delivery in
// flight and no call of its own parked: its batch is in the target.
func (sc *script) sending(in *instance, p int) bool {
	r := sc.w.db.cursors[cursorKey{group, topic, p}]
	suffix := "/p" + strconv.Itoa(p)
	for _, c := range sc.w.s.calls(in.proc) {
		if strings.HasSuffix(c.role, suffix) {
			return false
		}
	}
	return r != nil && r.inflightTo > r.seq
}

// insert begins a publisher's transaction on the forwarder-only topic
// that inserts one message into partition p (its id drawn now); commit
// commits it.
func (sc *script) insert(p int) *openPub {
	w := sc.w
	for k := range 1000 {
		key := "k" + strconv.Itoa(k)
		if part, _ := (partitioning.Murmur2{}).Partition(key, w.sh.partitions); part != p {
			continue
		}
		w.nextMsg++
		w.pubClock++
		m := pubMsg{uuid: "m" + strconv.Itoa(w.nextMsg), key: key, partition: p, inserted: w.pubClock}
		m.payload = []byte(m.uuid)
		op := &openPub{msgs: []pubMsg{m}, rows: w.db.insertPending([]pendingRow{{partition: p, uuid: m.uuid, key: key, payload: m.payload}})}
		w.s.trace("script: a publisher inserts %s into partition %d (id %d)", m.uuid, p, op.rows[0].id)
		return op
	}
	sc.err = fmt.Errorf("no key of partition %d", p)
	return &openPub{}
}

func (sc *script) commit(op *openPub) {
	if len(op.msgs) > 0 {
		sc.w.commitPub(op)
	}
}

// ScenarioLateCommitAfterAnUnrecordedRound: a forwarder-only topic's
// numbering holds only until a round is recorded. Publisher A inserts a
// message (id 1) and commits after B (id 2); forwarder I sends B's
// message as seq 1, Kafka commits it, and the statement that records the
// round fails before it takes effect; then A commits. Read again, pending
// now holds ids 1 and 2, which would be seqs 1 and 2: I must reconcile
// with Kafka first (seq 1 is id 2: gone from pending, the cursor at 1),
// and send A's message as seq 2. Without that, the producer's own record
// of what it committed (seq 1) would skip A's message as sent and send
// B's again.
func scenarioLateCommitAfterAnUnrecordedRound(sc *script) {
	w := sc.w
	i := w.instances[0]
	late := sc.insert(0)
	sc.commit(sc.insert(0))
	var rec *call
	sc.until("I records its first round", func() bool {
		rec = sc.parked(i, "db", "db.forwarded")
		return rec != nil
	}, nil)
	if sc.err != nil {
		return
	}
	w.s.trace("script: the statement that records it fails")
	w.s.resume(rec, failBefore)
	sc.commit(late)
}
