package chaos

import (
	"context"
	"sync"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
)

// chaos publishes for the run's duration while it kills children, restarts
// the server and cuts the broker off; it returns when all of that stopped
// and every child runs again.
func (r *run) chaos() {
	t := r.t
	r.started = time.Now()
	ctx, cancel := context.WithTimeout(r.ctx, r.dur)
	defer cancel()
	var wg sync.WaitGroup
	mode := outbox.ModeTable
	if r.sc.wal {
		mode = outbox.ModeWAL
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: r.pool, Mode: mode}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The publishers share one pace: a transaction (2.25 messages on
	// average) per tick, whoever is free takes it.
	pace := time.NewTicker(time.Duration(2.25 * float64(time.Second) / float64(max(1, *flagRate))))
	defer pace.Stop()
	for i := 0; i < r.sc.publisherCount(); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.publish(ctx, pub, i, pace.C)
		}()
	}
	if r.selftest {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sleep(ctx, r.dur*15/100) {
				r.inject(pub)
			}
		}()
	}

	// The schedule of the server restarts and broker outages: one of each
	// per slot, the restart in its first half, the outage in its second.
	rng := r.rng(1)
	nRestarts := max(1, int(r.dur/(90*time.Second)))
	nOutages := max(1, int(r.dur/(60*time.Second)))
	for i := 0; i < nRestarts; i++ {
		slot := r.dur / time.Duration(nRestarts)
		at := time.Duration(float64(slot) * (float64(i) + 0.25 + 0.2*rng.Float64()))
		down := time.Duration(500+rng.IntN(1500)) * time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleep(ctx, at) {
				return
			}
			t.Logf("%6.1fs: PostgreSQL immediate restart (down %v)", time.Since(r.started).Seconds(), down)
			rctx, cancel := context.WithTimeout(r.ctx, 2*time.Minute)
			defer cancel()
			if err := r.cluster.Restart(rctx, pgcluster.RestartOptions{Mode: pgcluster.Immediate, Down: down}); err != nil {
				t.Errorf("PostgreSQL restart: %v", err)
				return
			}
			r.pgRestarts.Add(1)
		}()
	}
	for i := 0; i < nOutages; i++ {
		slot := r.dur / time.Duration(nOutages)
		at := time.Duration(float64(slot) * (float64(i) + 0.55 + 0.2*rng.Float64()))
		down := time.Duration(2000+rng.IntN(3000)) * time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleep(ctx, at) {
				return
			}
			t.Logf("%6.1fs: Kafka broker outage (%v)", time.Since(r.started).Seconds(), down)
			r.brokerProxies.Break()
			sleep(r.ctx, down)
			r.brokerProxies.Restore()
			r.outages.Add(1)
		}()
	}

	if r.sc.poisonBytes > 0 {
		// At least one poison message too large for the broker commits,
		// whatever chance does.
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sleep(ctx, r.dur/5) && r.publishPoison(ctx, pub, r.rng(4)) {
				r.forcedPoison.Add(1)
			}
		}()
	}

	var busy sync.Map // *Proc -> being killed and restarted, or frozen
	if r.sc.wal {
		r.walStorm(ctx, &wg, &busy)
	} else {
		r.tableStorm(ctx, &wg, &busy)
	}

	// Children that exit by themselves are started again (and counted).
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sleep(ctx, 500*time.Millisecond) {
			for _, p := range r.procs {
				if _, inUse := busy.Load(p); !inUse && !p.Running() && len(p.Stats().SelfExits) > 0 {
					_ = p.Start()
				}
			}
		}
	}()

	wg.Wait()
	r.chaosEnded = time.Now()
	for _, p := range r.procs {
		if err := p.Start(); err != nil {
			t.Fatalf("restart %s: %v", p.Name, err)
		}
	}
	t.Logf("%6.1fs: chaos over: %d transactions committed, every child running; draining", time.Since(r.started).Seconds(), r.rec.txCommitted.Load())
}

// tableStorm starts TestChaos's and TestChaosKafka's kills and freezes of
// the children (in wg, until ctx ends).
func (r *run) tableStorm(ctx context.Context, wg *sync.WaitGroup, busy *sync.Map) {
	t := r.t

	// The kills: every 1-3 s a child (each child in turn, in an order
	// shuffled again each round), sometimes every process of its role at
	// once (so that no instance of the group is left to take over), each
	// started again after up to a second.
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := r.rng(2)
		var kw sync.WaitGroup
		defer kw.Wait()
		var order []*Proc
		for {
			if !sleep(ctx, r.sc.killMin+time.Duration(rng.Int64N(int64(r.sc.killMax-r.sc.killMin)))) {
				return
			}
			if len(order) == 0 {
				order = append(order, r.procs...)
				rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			}
			victims := []*Proc{order[0]}
			order = order[1:]
			if rng.IntN(10) == 0 {
				role := victims[0].Role
				victims = nil
				for _, p := range r.procs {
					if p.Role == role {
						victims = append(victims, p)
					}
				}
				r.groupKills.Add(1)
			}
			for _, p := range victims {
				if _, inUse := busy.LoadOrStore(p, true); inUse {
					continue
				}
				delay := time.Duration(rng.IntN(1000)) * time.Millisecond
				kw.Add(1)
				go func() {
					defer kw.Done()
					defer busy.Delete(p)
					if p.Kill() {
						r.kills.Add(1)
					}
					time.Sleep(delay)
					if err := p.Start(); err != nil {
						t.Errorf("restart %s: %v", p.Name, err)
					}
				}()
			}
		}
	}()

	// The freezes: every 4-10 s a child is stopped (SIGSTOP) for longer
	// than its leases last, then goes on (SIGCONT) as a zombie whose
	// partitions others took over meanwhile.
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := r.rng(3)
		var pw sync.WaitGroup
		defer pw.Wait()
		var forwarders []*Proc
		for _, p := range r.procs {
			if p.Role == RoleForwarder {
				forwarders = append(forwarders, p)
			}
		}
		frozen := 0
		next := func() time.Duration {
			if n := r.sc.forwarderFreezes; n > 0 {
				// Evenly spread, the last well before the end.
				return r.dur * 4 / 5 / time.Duration(n)
			}
			return time.Duration(4000+rng.IntN(6000)) * time.Millisecond
		}
		for sleep(ctx, next()) {
			p := r.procs[rng.IntN(len(r.procs))]
			if r.sc.forwarderFreezes > 0 {
				if frozen >= r.sc.forwarderFreezes {
					return
				}
				p = forwarders[frozen%len(forwarders)]
				// A freeze must not be skipped: wait for a kill of the
				// process to finish.
				for {
					if _, inUse := busy.LoadOrStore(p, true); !inUse {
						break
					}
					if !sleep(ctx, 50*time.Millisecond) {
						return
					}
				}
				frozen++
			} else if _, inUse := busy.LoadOrStore(p, true); inUse {
				continue
			}
			d := r.sc.lease() + time.Duration(500+rng.IntN(2500))*time.Millisecond
			pw.Add(1)
			go func() {
				defer pw.Done()
				defer busy.Delete(p)
				if p.Pause(d) {
					r.pauses.Add(1)
				}
			}()
		}
	}()
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
