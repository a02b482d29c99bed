package chaos

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/relay"
)

// The log-based storm's settings (TestChaosKafkaWAL). The storm
// ran leases of 6 s and froze forwarders for 10 s; these keep that ratio
// at half the time, so that the run fits in CI.
const (
	// walTakeoverTimeout is the relays' relay.Config.TakeoverTimeout.
	walTakeoverTimeout = 3 * time.Second
	// walLeaseTTL is the forwarders' lease TTL.
	walLeaseTTL = 3 * time.Second
	// walForwarderFreeze is how long a forwarder is frozen: 10/6 of its
	// lease.
	walForwarderFreeze = walLeaseTTL * 10 / 6
	// walForwarderFreezes forwarders holding leases are frozen, at evenly
	// spread times.
	walForwarderFreezes = 2
	// walForwarderKillMin and walForwarderKillMax bound the time between
	// two SIGKILLs of a forwarder (each has its own schedule).
	walForwarderKillMin, walForwarderKillMax = 2 * time.Second, 6 * time.Second
	// walRelayKills and walRelayFreezes: at least that many SIGKILLs and
	// freezes of the relay streaming the slot (the storm goes on past the
	// run's duration until it did them).
	walRelayKills, walRelayFreezes = 2, 2
	// walTakeoverWait bounds a relay freeze that waits for the standby to
	// take over: 10 times TakeoverTimeout.
	walTakeoverWait = 10 * walTakeoverTimeout
	// walPoisonBytes pads a poison message, over the Kafka topic's
	// max.message.bytes (kafkaMaxMessageBytes, 64 KiB): 70 kB.
	walPoisonBytes = 70_000
	// markerTopic is the outbox topic of the drain's marker (waitRelayed):
	// registered, never forwarded.
	markerTopic = "chaos-relayed"

	groupWAL = "chaos-kafka-wal"
)

// kafkaWAL is TestChaosKafkaWAL's scenario: the storm of the
// log-based mode — 8 publishers in outbox.ModeWAL (10% of the
// transactions rolled back, 3% held open 0.5-3 s), two relay processes,
// three exactly-once forwarder processes of one consumer group into one
// Kafka topic through the breakable proxies, poison too large for the
// broker.
var kafkaWAL = scenario{
	children: []childSpec{
		{role: RoleRelay, group: "relay", count: 2},
		{role: RoleForwarder, group: groupWAL, count: 3},
	},
	kafkaTopics: map[string]int{topic: partitions},
	wal:         true,
	publishers:  8,
	holds:       []hold{{0.03, 500 * time.Millisecond, 3 * time.Second}},
	poisonBytes: walPoisonBytes,
	leaseTTL:    walLeaseTTL,
}

// TestChaosKafkaWAL is the Kafka chaos test of the log-based mode: the
// publishers write into the WAL (outbox.ModeWAL), two relay processes
// (RoleRelay, as `outbox pipeline --wal` runs them, TakeoverTimeout 3 s)
// stream the slot into the log, one at a time, and three forwarder
// processes of one consumer group forward the log exactly once to Kafka
// through the breakable proxies. The storm (walStorm): each forwarder
// SIGKILLed every 2-6 s (rebalances), two forwarders holding leases frozen
// for 5 s (their lease is 3 s), the relay streaming the slot SIGKILLed and
// frozen past TakeoverTimeout until the standby streams (at least twice
// each), a PostgreSQL immediate restart, a broker outage; 1% of the
// messages (and one at least) are 70 kB poison, which the topic's
// max.message.bytes of 64 KiB refuses. The verifier reads the log and the
// Kafka topic (read_committed) back: the relays appended every committed
// message once, in key order, and nothing else; Kafka holds every
// committed message once, in key order, but the poison, which the
// forwarders dead-lettered; nothing lost, nothing else dead-lettered.
//
//	go test ./integration/chaos -run TestChaosKafkaWAL -v [-chaos.duration=2m -chaos.seed=N]
func TestChaosKafkaWAL(t *testing.T) {
	dur := 30 * time.Second
	if flagSet("chaos.duration") {
		dur = *flagDuration
	}
	r := runChaos(t, kafkaWAL, dur, false)
	r.checkWALStorm()
}

// walCounts counts what walStorm did.
type walCounts struct {
	mu sync.Mutex
	// forwarderKills counts the forwarder SIGKILLs, forwarderSkips the
	// kills skipped because the forwarder was frozen.
	forwarderKills, forwarderSkips int
	// forwarderFreezes counts the freezes of a forwarder holding leases.
	forwarderFreezes int
	// relayKills and relayFreezes count the SIGKILLs and freezes of the
	// relay streaming the slot; relayTakeovers the freezes during which
	// the other relay was seen streaming it.
	relayKills, relayFreezes, relayTakeovers int
}

func (c *walCounts) add(f func(c *walCounts)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c)
}

func (c *walCounts) get() walCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return walCounts{forwarderKills: c.forwarderKills, forwarderSkips: c.forwarderSkips, forwarderFreezes: c.forwarderFreezes,
		relayKills: c.relayKills, relayFreezes: c.relayFreezes, relayTakeovers: c.relayTakeovers}
}

// minForwarderKills is the fewest forwarder SIGKILLs walStorm's schedule
// makes in dur: each forwarder's loop takes at most walForwarderKillMax
// and a second (the restart delay) a round, plus the kill and the start
// (half a second, a generous bound), and each freeze skips at most the
// rounds that fall within it.
func minForwarderKills(dur time.Duration, forwarders int) int {
	rounds := int(dur / (walForwarderKillMax + 1500*time.Millisecond))
	skipped := walForwarderFreezes * int(walForwarderFreeze/walForwarderKillMin+1)
	return max(0, forwarders*rounds-skipped)
}

// walStorm starts the log-based storm's kills and freezes (in wg): each
// forwarder SIGKILLed every walForwarderKillMin-Max until ctx ends, and
// started again within a second (a kill of a frozen forwarder is
// skipped); walForwarderFreezes freezes of the forwarder holding the
// most leases, spread evenly over the run; and the relay streaming the
// slot killed and frozen in turn every 1.5-3 s until ctx ends and at
// least walRelayKills and walRelayFreezes of each were done, a freeze
// lasting past TakeoverTimeout until the standby streams the slot.
func (r *run) walStorm(ctx context.Context, wg *sync.WaitGroup, busy *sync.Map) {
	t := r.t
	var forwarders, relays []*Proc
	for _, p := range r.procs {
		switch p.Role {
		case RoleForwarder:
			forwarders = append(forwarders, p)
		case RoleRelay:
			relays = append(relays, p)
		}
	}
	at := func() float64 { return time.Since(r.started).Seconds() }

	for i, p := range forwarders {
		wg.Go(func() {
			rng := r.rng(10 + uint64(i))
			span := int64(walForwarderKillMax - walForwarderKillMin)
			for sleep(ctx, walForwarderKillMin+time.Duration(rng.Int64N(span))) {
				delay := time.Duration(rng.IntN(1000)) * time.Millisecond
				if _, inUse := busy.LoadOrStore(p, true); inUse {
					r.wal.add(func(c *walCounts) { c.forwarderSkips++ })
					continue
				}
				if p.Kill() {
					r.kills.Add(1)
					r.wal.add(func(c *walCounts) { c.forwarderKills++ })
				}
				time.Sleep(delay)
				if err := p.Start(); err != nil {
					t.Errorf("restart %s: %v", p.Name, err)
				}
				busy.Delete(p)
			}
		})
	}

	wg.Go(func() {
		for i := range walForwarderFreezes {
			if !sleep(r.ctx, time.Until(r.started.Add(r.dur*time.Duration(i+1)/(walForwarderFreezes+1)))) {
				return
			}
			p, leases := r.leaseHolder(forwarders, busy)
			if p == nil {
				return
			}
			t.Logf("%6.1fs: forwarder %s (holding %d leases) frozen for %v (lease %v)", at(), p.Name, leases, walForwarderFreeze, walLeaseTTL)
			if p.Pause(walForwarderFreeze) {
				r.pauses.Add(1)
				r.wal.add(func(c *walCounts) { c.forwarderFreezes++ })
			}
			busy.Delete(p)
		}
	})

	wg.Go(func() {
		rng := r.rng(30)
		for i := 0; ; i++ {
			c := r.wal.get()
			// Past the run's end only for the kills and freezes still owed.
			owed := c.relayKills < walRelayKills || c.relayFreezes < walRelayFreezes
			wait := ctx
			if owed {
				wait = r.ctx
			}
			if !sleep(wait, time.Duration(1500+rng.IntN(1500))*time.Millisecond) || !owed && ctx.Err() != nil {
				return
			}
			p := r.activeRelay(relays, busy)
			if p == nil {
				return
			}
			if i%2 == 0 {
				r.freezeRelay(p, relays)
			} else {
				t.Logf("%6.1fs: relay %s (streaming the slot) SIGKILLed", at(), p.Name)
				if p.Kill() {
					r.kills.Add(1)
					r.wal.add(func(c *walCounts) { c.relayKills++ })
				}
				time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
				if err := p.Start(); err != nil {
					t.Errorf("restart %s: %v", p.Name, err)
				}
			}
			busy.Delete(p)
		}
	})
}

// freezeRelay freezes p, the relay streaming the slot, past
// TakeoverTimeout and until another relay streams the slot (at most
// walTakeoverWait), then lets it go on as a zombie.
func (r *run) freezeRelay(p *Proc, relays []*Proc) {
	t := r.t
	started := time.Since(r.started).Seconds()
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	var took string
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		if !sleep(ctx, walTakeoverTimeout+time.Second) {
			return
		}
		wctx, wcancel := context.WithTimeout(ctx, walTakeoverWait)
		defer wcancel()
		for {
			qctx, qcancel := context.WithTimeout(wctx, 2*time.Second)
			st, err := relay.StatusOf(qctx, r.pool, schema)
			qcancel()
			if err == nil && st.Active && st.ActiveInstance != p.Name {
				for _, o := range relays {
					if o.Name == st.ActiveInstance {
						took = o.Name
						return
					}
				}
			}
			if !sleep(wctx, 100*time.Millisecond) {
				return
			}
		}
	}()
	frozen := p.PauseUntil(ctx)
	<-done
	if !frozen {
		return
	}
	r.pauses.Add(1)
	r.wal.add(func(c *walCounts) {
		c.relayFreezes++
		if took != "" {
			c.relayTakeovers++
		}
	})
	if took != "" {
		t.Logf("%6.1fs: relay %s (streaming the slot) frozen past TakeoverTimeout %v for %.1fs, until %s streamed it", started, p.Name, walTakeoverTimeout,
			time.Since(r.started).Seconds()-started, took)
	} else {
		t.Logf("%6.1fs: relay %s (streaming the slot) frozen for %.1fs: no other relay streamed the slot within %v past TakeoverTimeout %v", started, p.Name,
			time.Since(r.started).Seconds()-started, walTakeoverWait, walTakeoverTimeout)
	}
}

// walNobodyWait bounds how long walStorm waits for a relay streaming the
// slot, or a forwarder holding leases, before it fails the test.
const walNobodyWait = time.Minute

// activeRelay waits until one of relays streams the slot and is neither
// being killed nor frozen, marks it busy and returns it (nil, the test
// failed, when none did for walNobodyWait).
func (r *run) activeRelay(relays []*Proc, busy *sync.Map) *Proc {
	since := time.Now()
	for {
		ctx, cancel := context.WithTimeout(r.ctx, 2*time.Second)
		st, err := relay.StatusOf(ctx, r.pool, schema)
		cancel()
		if err == nil && st.Active {
			for _, p := range relays {
				if p.Name == st.ActiveInstance && p.Running() {
					if _, inUse := busy.LoadOrStore(p, true); !inUse {
						return p
					}
				}
			}
		}
		if time.Since(since) > walNobodyWait {
			r.t.Errorf("%6.1fs: no relay streamed the slot for %v (last status %+v, err %v)", time.Since(r.started).Seconds(), walNobodyWait, st, err)
			return nil
		}
		if !sleep(r.ctx, 100*time.Millisecond) {
			return nil
		}
	}
}

// leaseHolder waits until one of forwarders holds a live lease and is
// neither being killed nor frozen, marks the one holding the most busy
// and returns it with its lease count (nil, the test failed, when none
// did for walNobodyWait). A forwarder's leases are those whose owner
// (host:pid-…, the Subscriber's member id) has its process id.
func (r *run) leaseHolder(forwarders []*Proc, busy *sync.Map) (*Proc, int) {
	since := time.Now()
	for {
		ctx, cancel := context.WithTimeout(r.ctx, 2*time.Second)
		held, err := r.leasesByPid(ctx)
		cancel()
		if err == nil {
			var best *Proc
			most := 0
			for _, p := range forwarders {
				if n := held[p.Pid()]; n > most && p.Pid() != 0 {
					if _, inUse := busy.Load(p); !inUse {
						best, most = p, n
					}
				}
			}
			if best != nil {
				if _, inUse := busy.LoadOrStore(best, true); !inUse {
					return best, most
				}
			}
		}
		if time.Since(since) > walNobodyWait {
			r.t.Errorf("%6.1fs: no forwarder held a lease for %v (leases by process id %v, err %v)", time.Since(r.started).Seconds(), walNobodyWait, held, err)
			return nil, 0
		}
		if !sleep(r.ctx, 100*time.Millisecond) {
			return nil, 0
		}
	}
}

// leasesByPid counts the live leases of the forwarder group by the
// process id in their owner.
func (r *run) leasesByPid(ctx context.Context) (map[int]int, error) {
	rows, err := r.pool.Query(ctx, `SELECT lease_owner FROM `+schema+`.cursors
		WHERE group_name = $1 AND topic = $2 AND lease_owner IS NOT NULL AND lease_expires_at > now()`, groupWAL, topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := map[int]int{}
	for rows.Next() {
		var owner string
		if err := rows.Scan(&owner); err != nil {
			return nil, err
		}
		if pid, ok := ownerPid(owner); ok {
			held[pid]++
		}
	}
	return held, rows.Err()
}

// ownerPid is the process id in a lease owner "host:pid-suffix".
func ownerPid(owner string) (int, bool) {
	i := strings.LastIndex(owner, ":")
	if i < 0 {
		return 0, false
	}
	rest := owner[i+1:]
	if j := strings.IndexByte(rest, '-'); j >= 0 {
		rest = rest[:j]
	}
	pid, err := strconv.Atoi(rest)
	return pid, err == nil
}

// waitRelayed returns once the relays appended everything committed
// before it was called: it commits a marker message on markerTopic in
// ModeWAL (after every publisher stopped) and waits until the log holds
// one; a relay appends in commit order, so every transaction that
// committed before the marker was appended (or skipped) then. A message
// a relay skipped is then in no stream: the verifier reports it lost.
func (r *run) waitRelayed(ctx context.Context) error {
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: r.pool, Mode: outbox.ModeWAL}, nil)
	if err != nil {
		return err
	}
	for i := 0; ; i++ {
		err := func() error {
			tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			tx, err := r.pool.Begin(tctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			m := message.NewMessage(fmt.Sprintf("marker-%d", i), []byte("relayed"))
			m.SetContext(outbox.WithTx(tctx, tx))
			if err := pub.Publish(markerTopic, m); err != nil {
				return err
			}
			return tx.Commit(tctx)
		}()
		if err == nil {
			break
		}
		if !sleep(ctx, 500*time.Millisecond) {
			return fmt.Errorf("commit the marker: %w", err)
		}
	}
	for {
		var n int
		err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.log WHERE topic = $1`, markerTopic).Scan(&n)
		if err == nil && n > 0 {
			return nil
		}
		if !sleep(ctx, 100*time.Millisecond) {
			if err == nil {
				err = errors.New("no relay appended the marker")
			}
			return err
		}
	}
}

// checkWALStorm fails the test if the storm did less than it must to
// prove anything.
func (r *run) checkWALStorm() {
	t := r.t
	c := r.wal.get()
	forwarders := 0
	relaySelfExits := 0
	for _, p := range r.procs {
		switch p.Role {
		case RoleForwarder:
			forwarders++
		case RoleRelay:
			relaySelfExits += len(p.Stats().SelfExits)
		}
	}
	var deadLetters int
	for _, s := range r.report.Streams {
		if strings.HasPrefix(s.Name, "kafka ") {
			deadLetters += s.DeadLetters
		}
	}
	minKills := minForwarderKills(r.dur, forwarders)
	switch {
	case c.forwarderKills < minKills, c.forwarderFreezes < walForwarderFreezes,
		c.relayKills < walRelayKills, c.relayFreezes < walRelayFreezes,
		r.pgRestarts.Load() < 1, r.outages.Load() < 1, r.forcedPoison.Load() < 1, deadLetters < 1:
		t.Errorf("the storm was too weak to prove anything: %d forwarder SIGKILLs (want %d+), %d freezes of a forwarder holding leases (want %d), "+
			"%d SIGKILLs and %d freezes of the relay streaming the slot (want %d and %d), %d PostgreSQL restarts and %d broker outages (want 1 each), "+
			"%d poison messages forced and %d dead letters of the forwarders (want 1+ each)",
			c.forwarderKills, minKills, c.forwarderFreezes, walForwarderFreezes, c.relayKills, c.relayFreezes, walRelayKills, walRelayFreezes,
			r.pgRestarts.Load(), r.outages.Load(), r.forcedPoison.Load(), deadLetters)
	}
	if c.relayTakeovers < c.relayFreezes {
		t.Errorf("a standby relay did not take the slot over within %v of a freeze past TakeoverTimeout (%v) in %d of %d freezes",
			walTakeoverWait, walTakeoverTimeout, c.relayFreezes-c.relayTakeovers, c.relayFreezes)
	}
	if relaySelfExits > 0 {
		t.Errorf("relay processes stopped by themselves %d times (relay.Run returned an error it could not mend; see the summary)", relaySelfExits)
	}
}
