package chaos

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/inbox"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
)

var (
	flagDuration = flag.Duration("chaos.duration", 40*time.Second, "how long TestChaos publishes and breaks things (then it drains and verifies)")
	flagSeed     = flag.Uint64("chaos.seed", 0, "seed of TestChaos's schedule and choices (0: a new one, printed)")
	flagSelfTest = flag.Bool("chaos.selftest", false, "TestChaos injects one lost, phantom, reordered and duplicated message and passes only if the verifier catches each")
	flagRate     = flag.Int("chaos.rate", 100, "messages per second TestChaos's publishers aim at")
	flagKeep     = flag.Bool("chaos.keep", false, "keep TestChaos's log directory even when it passes")
)

// The run's fixed settings.
const (
	schema      = "chaos"
	topic       = "chaos"
	partitions  = 8
	keys        = 64
	publishers  = 10
	poisonRate  = 0.01
	maxAttempts = 10 // of both subscriber groups; the forwarder has none
	leaseTTL    = 2 * time.Second

	groupTx     = "chaos-transactional"
	groupLeased = "chaos-leased"
	groupKafka  = "chaos-kafka"
)

// childSpec is a group of child processes of one role.
type childSpec struct {
	role, group string
	count       int
	// kafkaTopic: the topic a forwarder writes (default: topic) or an
	// inbox consumer reads.
	kafkaTopic  string
	atLeastOnce bool // a forwarder's mode
}

func (c childSpec) topic() string {
	if c.kafkaTopic == "" {
		return topic
	}
	return c.kafkaTopic
}

// scenario is what a chaos run runs and breaks.
type scenario struct {
	children []childSpec
	// kafkaTopics are the Kafka topics and their partition counts, by the
	// names the children use here (each run creates them under names of
	// its own: run.kafkaTopics).
	kafkaTopics map[string]int
	// Every killMin to killMax a child is SIGKILLed.
	killMin, killMax time.Duration
	// forwarderFreezes > 0: that many freezes past the lease, each of a
	// forwarder, spread over the run; 0: a random child every 4-10 s.
	forwarderFreezes int
}

// everything is TestChaos's scenario: subscribers of both strategies and
// a forwarder to Kafka, two processes each.
var everything = scenario{
	children: []childSpec{
		{role: RoleTransactional, group: groupTx, count: 2},
		{role: RoleLeased, group: groupLeased, count: 2},
		{role: RoleForwarder, group: groupKafka, count: 2},
	},
	kafkaTopics: map[string]int{topic: partitions},
	killMin:     time.Second, killMax: 3 * time.Second,
}

// TestChaosChild is a child process of TestChaos: it runs the role given
// in EnvChild until it is killed or receives SIGTERM.
func TestChaosChild(t *testing.T) {
	cfg, ok, err := ChildFromEnv()
	if !ok {
		t.Skip("only runs as a child process of TestChaos")
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := RunChild(ctx, cfg); err != nil {
		t.Fatalf("%s: %v", cfg.Name, err)
	}
}

// TestChaos: see the package documentation.
func TestChaos(t *testing.T) {
	dur := *flagDuration
	if testing.Short() && !flagSet("chaos.duration") {
		dur = 15 * time.Second
	}
	runChaos(t, everything, dur, *flagSelfTest)
}

// kafkaExactlyOnce is TestChaosKafka's scenario: one outbox topic (8
// partitions) forwarded to three Kafka topics, exactly once with equal
// partition counts (8) and with unequal ones (5), and at least once twice
// over (two forwarder groups into one topic, so every message arrives
// there at least twice), which two inbox consumers, a Kafka consumer
// group, read.
var kafkaExactlyOnce = scenario{
	children: []childSpec{
		{role: RoleForwarder, group: "chaos-kafka-equal", count: 2, kafkaTopic: "chaos-equal"},
		{role: RoleForwarder, group: "chaos-kafka-unequal", count: 2, kafkaTopic: "chaos-unequal"},
		{role: RoleForwarder, group: "chaos-kafka-twice-a", count: 1, kafkaTopic: "chaos-twice", atLeastOnce: true},
		{role: RoleForwarder, group: "chaos-kafka-twice-b", count: 1, kafkaTopic: "chaos-twice", atLeastOnce: true},
		{role: RoleInbox, group: "chaos-inbox", count: 2, kafkaTopic: "chaos-twice"},
	},
	kafkaTopics: map[string]int{"chaos-equal": partitions, "chaos-unequal": 5, "chaos-twice": partitions},
	killMin:     400 * time.Millisecond, killMax: 1200 * time.Millisecond,
	forwarderFreezes: 4,
}

// TestChaosKafka proves exactly-once delivery into Kafka and the inbox
// under the same storm as TestChaos (plus a kill every 0.4-1.2 s and four
// freezes of exactly-once forwarders past their leases): each Kafka topic
// an exactly-once forwarder writes holds each committed message once, in
// key order, with equal and with unequal partition counts; the inbox
// consumers' effects hold each message once, in key order, although
// every message reached their topic at least twice and the consumers were
// killed mid-batch (redeliveries, rebalances).
func TestChaosKafka(t *testing.T) {
	dur := 30 * time.Second
	if flagSet("chaos.duration") {
		dur = *flagDuration
	}
	r := runChaos(t, kafkaExactlyOnce, dur, false)
	kills, freezes := map[string]int{}, map[string]int{}
	for _, p := range r.procs {
		st := p.Stats()
		kills[p.Role] += st.Kills
		freezes[p.Role] += st.Pauses
	}
	if kills[RoleForwarder] < 20 || freezes[RoleForwarder] < 3 || kills[RoleInbox] < 2 {
		t.Errorf("the storm was too weak to prove anything: %d forwarder SIGKILLs (want 20+), %d forwarder freezes past the lease (want 3+), %d inbox consumer SIGKILLs (want 2+)",
			kills[RoleForwarder], freezes[RoleForwarder], kills[RoleInbox])
	}
}

// runChaos runs sc for dur, drains, reads everything back and verifies.
func runChaos(t *testing.T, sc scenario, dur time.Duration, selftest bool) *run {
	if _, child, _ := ChildFromEnv(); child {
		t.Skip("a child process")
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	drainTimeout := 2*time.Minute + dur/5
	if deadline, ok := t.Deadline(); ok {
		if need := dur + drainTimeout + time.Minute; time.Until(deadline) < need {
			t.Fatalf("-chaos.duration=%v needs -timeout of at least %v (the run, the drain and set-up)", dur, need.Round(time.Minute))
		}
	}
	t.Logf("seed %d (the same schedule again: -chaos.seed=%d), duration %v, selftest %v", seed, seed, dur, selftest)

	r := newRun(t, seed, dur, selftest, sc)
	r.setUp()
	r.chaos()
	drained := r.drain(drainTimeout)
	r.stopChildren()
	in := r.collect()
	report := Verify(in)
	r.summarize(report, drained)
	if selftest {
		r.checkSelfTest(report)
	} else if !report.OK() {
		t.Errorf("the verifier found faults (seed %d):\n%s", seed, report)
	}
	return r
}

// flagSet reports whether the flag was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// run is one chaos run.
type run struct {
	t        *testing.T
	sc       scenario
	seed     uint64
	dur      time.Duration
	selftest bool
	dir      string // logs of the children and the server
	ctx      context.Context

	cluster *pgcluster.Cluster
	pool    *pgxpool.Pool
	// kafka is kfake or the cluster of OUTBOX_TEST_KAFKA_BROKERS; the
	// children reach it only through brokerProxies, which the broker
	// outages break.
	kafka         *kafkatest.Cluster
	brokerProxies *kafkatest.ProxyMap
	// runID makes the run's Kafka names its own: the topics (kafkaTopics,
	// scenario name → created name), the exactly-once forwarders'
	// transactional ids and the inbox consumers' consumer groups.
	runID       string
	kafkaTopics map[string]string
	procs       []*Proc
	rec         *recorder

	pgRestarts atomic.Int32
	outages    atomic.Int32
	// inboxRestarts counts the restarts of stalled inbox consumers in the
	// drain (see drain).
	inboxRestarts int
	kills         atomic.Int32
	pauses        atomic.Int32
	groupKills    atomic.Int32
	injected      map[Kind]string // selftest: the key of each injected fault
	started       time.Time
	chaosEnded    time.Time
	drainedAt     time.Time
	stopErrors    []string
}

func newRun(t *testing.T, seed uint64, dur time.Duration, selftest bool, sc scenario) *run {
	dir, err := os.MkdirTemp("", "outbox-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{t: t, sc: sc, seed: seed, dur: dur, selftest: selftest, dir: dir, ctx: ctx, rec: newRecorder()}
	t.Cleanup(func() {
		cancel()
		// No child outlives the test, whatever happened.
		for _, p := range r.procs {
			p.Kill()
		}
		if r.pool != nil {
			r.pool.Close()
		}
		if r.cluster != nil {
			r.cluster.Stop()
		}
		if t.Failed() || *flagKeep {
			t.Logf("logs of the run (children, postgres.log): %s", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	})
	return r
}

func (r *run) rng(stream uint64) *rand.Rand { return rand.New(rand.NewPCG(r.seed, stream)) }

func (r *run) setUp() {
	t := r.t
	ctx, cancel := context.WithTimeout(r.ctx, 2*time.Minute)
	defer cancel()
	pgLog, err := os.Create(filepath.Join(r.dir, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pgLog.Close() })
	var pgLogMu sync.Mutex
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{
		// Acknowledged commits must survive the immediate restarts: with
		// synchronous_commit off they need not, and a "lost" message
		// would be the server's doing. fsync may stay off: the operating
		// system does not crash.
		Settings: map[string]string{"synchronous_commit": "on", "log_min_messages": "log"},
		Log: func(line string) {
			pgLogMu.Lock()
			defer pgLogMu.Unlock()
			fmt.Fprintln(pgLog, line)
		},
	})
	if errors.Is(err, pgcluster.ErrNoServerBinaries) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	r.cluster = cluster
	url := cluster.URL("")
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 16
	pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	if r.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, r.pool, schema); err != nil {
		t.Fatal(err)
	}
	if err := outbox.RegisterTopic(ctx, r.pool, schema, topic, partitions); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(ctx, ResultsDDL(schema)); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, r.pool, inbox.DefaultSchema); err != nil {
		t.Fatal(err)
	}
	// The aggregates: a key's counter, bumped by each transaction that
	// publishes for the key (under its row lock, so in commit order), and
	// the transactions that committed.
	if _, err := r.pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE %[1]s.chaos_keys (key text PRIMARY KEY, n int NOT NULL);
		INSERT INTO %[1]s.chaos_keys SELECT 'k' || lpad(i::text, 2, '0'), 0 FROM generate_series(0, %[2]d) i;
		CREATE TABLE %[1]s.chaos_txs (tx text PRIMARY KEY)`, schema, keys-1)); err != nil {
		t.Fatal(err)
	}

	r.setUpKafka()

	// The children.
	for _, role := range r.sc.children {
		for i := 1; i <= role.count; i++ {
			cfg := r.childConfig(role, i, url)
			env, err := ChildEnv(cfg)
			if err != nil {
				t.Fatal(err)
			}
			p := NewProc(cfg.Name, role.role, os.Args[0],
				[]string{"-test.run=^TestChaosChild$", "-test.count=1", "-test.timeout=0"}, []string{env}, r.dir)
			r.procs = append(r.procs, p)
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// childConfig is the configuration of the i-th child (from 1) of role, on
// the database of url: the forwarders and inbox consumers with the run's
// Kafka topics, transactional ids and consumer groups, dialing the brokers
// through the run's proxies.
func (r *run) childConfig(role childSpec, i int, url string) ChildConfig {
	cfg := ChildConfig{
		Role: role.role, Name: fmt.Sprintf("%s-%d", role.group, i), DatabaseURL: url, Schema: schema, Topic: topic,
		Group: role.group, FlakyRate: 0.01, WorkDelay: 4 * time.Millisecond, LeaseTTL: leaseTTL,
		Seed: r.seed, AtLeastOnce: role.atLeastOnce,
	}
	switch role.role {
	case RoleTransactional, RoleLeased:
		cfg.MaxAttempts = maxAttempts
		return cfg
	case RoleForwarder:
		cfg.TransactionalIDPrefix = r.transactionalIDPrefix()
	case RoleInbox:
		cfg.KafkaGroup = r.kafkaGroup(role.group)
	}
	cfg.Brokers, cfg.BrokerMap = r.kafka.Brokers, r.brokerProxies.Addrs()
	cfg.KafkaTopic = r.kafkaTopics[role.topic()]
	return cfg
}

// setUpKafka gives the run its Kafka cluster, the same way on kfake (CI) and
// on the real cluster of OUTBOX_TEST_KAFKA_BROKERS: the scenario's topics
// under names of the run's own (deleted when the test ends), a breakable
// proxy in front of every broker address, seed or advertised (the children
// dial the brokers only through them, so that the broker outages cut them
// off), and the inbox consumers' consumer groups deleted when the test
// ends.
func (r *run) setUpKafka() {
	t := r.t
	id := make([]byte, 4)
	_, _ = crand.Read(id)
	r.runID = hex.EncodeToString(id)
	r.kafka = kafkatest.New(t)
	r.kafkaTopics = map[string]string{}
	for name, n := range r.sc.kafkaTopics {
		r.kafkaTopics[name] = r.kafka.Topic(t, name, n, nil)
	}
	r.brokerProxies = kafkatest.NewProxyMap(t, r.kafka)
	where := "kfake"
	if kafkatest.Real() {
		where = kafkatest.BrokersEnv + "=" + strings.Join(r.kafka.Brokers, ",")
	}
	t.Logf("Kafka: %s, run %s, topics %v, the children dial the brokers through the proxies %v",
		where, r.runID, r.kafkaTopics, r.brokerProxies.Addrs())
	var groups []string
	for _, c := range r.sc.children {
		if c.role == RoleInbox {
			groups = append(groups, r.kafkaGroup(c.group))
		}
	}
	// Cleanups run last first: this one before the topics and the
	// proxies go.
	t.Cleanup(func() {
		for _, p := range r.procs {
			p.Kill()
		}
		if len(groups) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := r.kafka.Admin().DeleteGroups(ctx, groups...)
		if err == nil {
			err = resp.Error()
		}
		if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
			t.Logf("delete the consumer groups %v: %v", groups, err)
		}
	})
}

// transactionalIDPrefix is the run's exactly-once forwarders'
// kafka.Config.TransactionalIDPrefix.
func (r *run) transactionalIDPrefix() string { return "chaos-" + r.runID }

// kafkaGroup is the Kafka consumer group of the run's inbox consumers of
// group.
func (r *run) kafkaGroup(group string) string { return group + "-" + r.runID }

// chaos publishes for the run's duration while it kills children, restarts
// the server and cuts the broker off; it returns when all of that stopped
// and every child runs again.
func (r *run) chaos() {
	t := r.t
	r.started = time.Now()
	ctx, cancel := context.WithTimeout(r.ctx, r.dur)
	defer cancel()
	var wg sync.WaitGroup
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: r.pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The publishers share one pace: a transaction (2.25 messages on
	// average) per tick, whoever is free takes it.
	pace := time.NewTicker(time.Duration(2.25 * float64(time.Second) / float64(max(1, *flagRate))))
	defer pace.Stop()
	for i := 0; i < publishers; i++ {
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

	var busy sync.Map // *Proc -> being killed and restarted, or frozen

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
			d := leaseTTL + time.Duration(500+rng.IntN(2500))*time.Millisecond
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

// lag returns how many (group, partition) cursors are behind the log,
// plus the pending messages, and a description of the laggards.
func (r *run) lag(ctx context.Context) (n, inboxMissing int, desc string, err error) {
	n, inboxMissing, desc, err = r.lagOf(ctx)
	return
}

func (r *run) lagOf(ctx context.Context) (int, int, string, error) {
	inboxMissing := 0
	var pending int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.pending`).Scan(&pending); err != nil {
		return 0, 0, "", err
	}
	rows, err := r.pool.Query(ctx, `
		SELECT g.name, p.partition, p.last_seq, coalesce(c.seq, 0), coalesce(c.last_error, ''), coalesce(c.lease_owner, ''), c.lease_expires_at > now()
		FROM `+schema+`.partitions p
		CROSS JOIN unnest($2::text[]) AS g(name)
		LEFT JOIN `+schema+`.cursors c ON c.group_name = g.name AND c.topic = p.topic AND c.partition = p.partition
		WHERE p.topic = $1 AND coalesce(c.seq, 0) < p.last_seq
		ORDER BY 1, 2`, topic, r.outboxGroups())
	if err != nil {
		return 0, 0, "", err
	}
	defer rows.Close()
	var b strings.Builder
	n := pending
	if pending > 0 {
		fmt.Fprintf(&b, "%d messages not sequenced; ", pending)
	}
	// An inbox consumer is done when it handled every message of the log.
	for _, c := range r.sc.children {
		if c.role != RoleInbox {
			continue
		}
		var missing int
		if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.log l WHERE l.topic = $1 AND NOT EXISTS (
			SELECT FROM `+schema+`.`+ResultsTable+` r WHERE r.grp = $2 AND r.outbox_id = l.topic || '/' || l.partition || '/' || l.seq)`,
			topic, c.group).Scan(&missing); err != nil {
			return 0, 0, "", err
		}
		if missing > 0 {
			n += missing
			inboxMissing += missing
			fmt.Fprintf(&b, "\n    inbox consumer %s: %d messages not handled", c.group, missing)
		}
	}
	for rows.Next() {
		var group, lastErr, owner string
		var partition int
		var head, cursor int64
		var leased *bool
		if err := rows.Scan(&group, &partition, &head, &cursor, &lastErr, &owner, &leased); err != nil {
			return 0, 0, "", err
		}
		n++
		fmt.Fprintf(&b, "\n    %s partition %d: cursor %d of %d, lease %q (live %v), last error %q", group, partition, cursor, head, owner, leased != nil && *leased, lastErr)
	}
	return n, inboxMissing, b.String(), rows.Err()
}

// outboxGroups are the consumer groups of the outbox in the scenario.
func (r *run) outboxGroups() []string {
	var groups []string
	for _, c := range r.sc.children {
		if c.role != RoleInbox {
			groups = append(groups, c.group)
		}
	}
	return groups
}

// inboxStall is how long the drain lets the inbox consumers (a Kafka
// consumer group) make no progress before it restarts them.
const inboxStall = 20 * time.Second

// drain waits until everything committed was sequenced and every group's
// cursors reached the log's heads; it reports whether that happened in
// time.
func (r *run) drain(timeout time.Duration) bool {
	t := r.t
	ctx, cancel := context.WithTimeout(r.ctx, timeout)
	defer cancel()
	r.rec.resolve(ctx, t, r.pool)
	lastLog := time.Now()
	least, progressAt := -1, time.Now()
	for {
		n, inboxMissing, desc, err := r.lag(ctx)
		if err == nil && (least < 0 || n < least) {
			least, progressAt = n, time.Now()
		}
		if err == nil && n > 0 && n == inboxMissing && time.Since(progressAt) > inboxStall {
			// Only the inbox consumers lag, and have not moved for a while:
			// the Kafka consumer group (sarama on kfake) has stalled, which
			// is not what this test is about. Restart them, as a
			// supervisor's liveness probe would, and say so.
			var waiting, inTx int
			_ = r.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*) FILTER (WHERE state LIKE 'idle in transaction%')
				FROM pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&waiting, &inTx)
			t.Logf("%6.1fs: the inbox consumers made no progress for %v with %d messages to go: restarting them (a stalled Kafka consumer group; "+
				"meanwhile %d sessions wait for a lock and %d are idle in a transaction)",
				time.Since(r.started).Seconds(), inboxStall, n, waiting, inTx)
			for _, p := range r.procs {
				if p.Role == RoleInbox {
					p.Kill()
					if err := p.Start(); err != nil {
						t.Errorf("restart %s: %v", p.Name, err)
					}
				}
			}
			r.inboxRestarts++
			progressAt = time.Now()
		}
		if err == nil && n == 0 {
			r.drainedAt = time.Now()
			t.Logf("%6.1fs: drained in %v", time.Since(r.started).Seconds(), time.Since(r.chaosEnded).Round(100*time.Millisecond))
			return true
		}
		if time.Since(lastLog) > 15*time.Second {
			t.Logf("%6.1fs: draining: %d behind (err %v): %s", time.Since(r.started).Seconds(), n, err, desc)
			lastLog = time.Now()
		}
		if !sleep(ctx, 250*time.Millisecond) {
			qctx, qcancel := context.WithTimeout(r.ctx, 10*time.Second)
			_, _, desc, err := r.lag(qctx)
			qcancel()
			t.Errorf("stall: not drained %v after the chaos ended (seed %d); behind: %s (err %v)", timeout, r.seed, desc, err)
			for _, p := range r.procs {
				t.Logf("%s: %+v", p.Name, p.Stats())
			}
			return false
		}
	}
}

// stopChildren stops every child gracefully; one that does not stop in
// time is a fault (a Close that hangs).
func (r *run) stopChildren() {
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, p := range r.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Stop(20 * time.Second); err != nil {
				mu.Lock()
				r.stopErrors = append(r.stopErrors, err.Error())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Strings(r.stopErrors)
	for _, e := range r.stopErrors {
		r.t.Errorf("a child did not stop cleanly: %s", e)
	}
}

// collect reads back everything the run produced.
func (r *run) collect() Input {
	t := r.t
	ctx, cancel := context.WithTimeout(r.ctx, 2*time.Minute)
	defer cancel()
	in := Input{Messages: r.rec.messages()}

	var log []Delivery
	rows, err := r.pool.Query(ctx, `SELECT partition, seq, uuid, coalesce(partition_key, ''), convert_from(payload, 'UTF8')
		FROM `+schema+`.log WHERE topic = $1 ORDER BY partition, seq`, topic)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var partition int
		var seq int64
		var d Delivery
		if err := rows.Scan(&partition, &seq, &d.UUID, &d.Key, &d.Payload); err != nil {
			t.Fatal(err)
		}
		d.OutboxID = outbox.StableID(topic, partition, seq)
		log = append(log, d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	results := map[string][]Delivery{}
	rows, err = r.pool.Query(ctx, `SELECT grp, outbox_id, uuid, key, payload FROM `+schema+`.`+ResultsTable+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var group string
		var d Delivery
		if err := rows.Scan(&group, &d.OutboxID, &d.UUID, &d.Key, &d.Payload); err != nil {
			t.Fatal(err)
		}
		results[group] = append(results[group], d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	dead := map[string][]DeadLetter{}
	rows, err = r.pool.Query(ctx, `SELECT group_name, partition, seq, uuid, reason FROM `+schema+`.dead_letters
		WHERE topic = $1 ORDER BY id`, topic)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var group string
		var partition *int
		var seq *int64
		var dl DeadLetter
		if err := rows.Scan(&group, &partition, &seq, &dl.UUID, &dl.Reason); err != nil {
			t.Fatal(err)
		}
		if partition != nil && seq != nil {
			dl.OutboxID = outbox.StableID(topic, *partition, *seq)
		}
		dead[group] = append(dead[group], dl)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	in.Streams = []Stream{{Name: "log", Reference: true, ExactlyOnce: true, Deliveries: log}}
	// A Kafka topic is exactly once when every forwarder writing to it is.
	kafkaTopics := map[string]*Stream{}
	var kafkaOrder []string
	for _, c := range r.sc.children {
		switch c.role {
		case RoleTransactional:
			in.Streams = append(in.Streams, Stream{Name: "transactional group", ExactlyOnce: true, RejectsPoison: true, MaxAttempts: maxAttempts,
				Deliveries: results[c.group], DeadLetters: dead[c.group]})
		case RoleLeased:
			in.Streams = append(in.Streams, Stream{Name: "leased group", RejectsPoison: true, MaxAttempts: maxAttempts,
				Deliveries: results[c.group], DeadLetters: dead[c.group]})
		case RoleInbox:
			in.Streams = append(in.Streams, Stream{Name: "inbox consumer " + c.group + " (Kafka " + c.topic() + ")", ExactlyOnce: true,
				Deliveries: results[c.group]})
		case RoleForwarder:
			s := kafkaTopics[c.topic()]
			if s == nil {
				s = &Stream{Name: "kafka " + c.topic(), ExactlyOnce: true}
				kafkaTopics[c.topic()] = s
				kafkaOrder = append(kafkaOrder, c.topic())
			}
			s.ExactlyOnce = s.ExactlyOnce && !c.atLeastOnce
			s.DeadLetters = append(s.DeadLetters, dead[c.group]...)
		}
	}
	for _, name := range kafkaOrder {
		s := kafkaTopics[name]
		var err error
		if s.Deliveries, err = readKafka(ctx, r.kafka.Brokers, r.kafkaTopics[name]); err != nil {
			t.Fatalf("reading Kafka topic %s back: %v", name, err)
		}
		if s.ExactlyOnce {
			s.Name += " (exactly once)"
		} else {
			s.Name += " (at least once)"
		}
		in.Streams = append(in.Streams, *s)
	}
	return in
}

// summarize logs what the run did and what the verifier saw.
func (r *run) summarize(report Report, drained bool) {
	t := r.t
	rec := r.rec
	var b strings.Builder
	fmt.Fprintf(&b, "chaos run, seed %d: %v of chaos", r.seed, r.chaosEnded.Sub(r.started).Round(100*time.Millisecond))
	if drained {
		fmt.Fprintf(&b, ", drained in %v", r.drainedAt.Sub(r.chaosEnded).Round(100*time.Millisecond))
	} else {
		b.WriteString(", NOT drained")
	}
	fmt.Fprintf(&b, ", %v in all\n", time.Since(r.started).Round(100*time.Millisecond))
	fmt.Fprintf(&b, "  transactions: %d committed, %d rolled back on purpose, %d failed (server restart), %d in doubt (%d of them had committed), %d held open for a while\n",
		rec.txCommitted.Load(), rec.txRolledBack.Load(), rec.txFailed.Load(), rec.txInDoubt.Load(), rec.inDoubtCommitted.Load(), rec.txHeld.Load())
	if n := rec.txCount.Load(); n > 0 {
		fmt.Fprintf(&b, "  a transaction took %v on average (the publishers aimed at %d messages/s)\n", time.Duration(rec.txNanos.Load()/n).Round(time.Millisecond), *flagRate)
	}
	fmt.Fprintf(&b, "  messages: %d committed (%d poison), %d rolled back, %d in doubt after resolution\n",
		report.Committed, report.Poison, report.RolledBack, report.InDoubt)
	fmt.Fprintf(&b, "  faults injected: %d SIGKILLs (%d of every process of a role at once), %d freezes past the lease (SIGSTOP, SIGCONT), %d PostgreSQL immediate restarts, %d Kafka broker outages\n",
		r.kills.Load(), r.groupKills.Load(), r.pauses.Load(), r.pgRestarts.Load(), r.outages.Load())
	if r.inboxRestarts > 0 {
		fmt.Fprintf(&b, "  after the chaos, the inbox consumers' Kafka consumer group stalled %d time(s) for %v: their processes were restarted\n",
			r.inboxRestarts, inboxStall)
	}
	byRole := map[string][4]int{}
	var selfExits []string
	for _, p := range r.procs {
		st := p.Stats()
		c := byRole[p.Role]
		c[0] += st.Kills
		c[1] += st.Starts
		c[2] += len(st.SelfExits)
		c[3] += st.Pauses
		byRole[p.Role] = c
		for _, e := range st.SelfExits {
			selfExits = append(selfExits, p.Name+": "+e)
		}
	}
	for _, role := range []string{RoleTransactional, RoleLeased, RoleForwarder, RoleInbox} {
		c, ok := byRole[role]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "  %s processes: %d killed, %d frozen, %d started, %d exited by themselves\n", role, c[0], c[3], c[1], c[2])
	}
	for _, e := range selfExits {
		fmt.Fprintf(&b, "    exited by itself: %s\n", e)
	}
	b.WriteString(indent(report.String(), "  "))
	t.Log("\n" + b.String())
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return prefix + strings.Join(lines, "\n"+prefix) + "\n"
}

// checkSelfTest checks, in a -chaos.selftest run, that the verifier caught
// each injected fault in every stream, and nothing else.
func (r *run) checkSelfTest(report Report) {
	t := r.t
	if report.OK() {
		t.Fatalf("self-test: the verifier found nothing, though one fault of each kind was injected")
	}
	if len(r.injected) == 0 {
		t.Fatalf("self-test: nothing was injected")
	}
	streams := []string{}
	for _, s := range report.Streams {
		streams = append(streams, s.Name)
	}
	for kind, key := range r.injected {
		for _, s := range streams {
			caught := false
			for _, f := range report.Faults {
				if f.Kind == kind && f.Stream == s && f.Key == key {
					caught = true
				}
			}
			if !caught {
				t.Errorf("self-test: the injected %q fault (key %s) was not caught in stream %s", kind, key, s)
			}
		}
	}
	for _, f := range report.Faults {
		if want, ok := r.injected[f.Kind]; !ok || f.Key != want {
			t.Errorf("self-test: a fault that was not injected: %s", f)
		}
	}
	if !t.Failed() {
		t.Logf("self-test passed: each injected fault (%v) was caught in every stream, and nothing else", r.injected)
	}
}
