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
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/relay"
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

	// wal: the publishers write in outbox.ModeWAL (the server runs with
	// wal_level = logical and the schema's slot exists), RoleRelay
	// children stream the slot into the log, and the storm is walStorm
	// (wal_test.go) instead of the kills and freezes above.
	wal bool
	// publishers is the number of publishing goroutines (default
	// publishers).
	publishers int
	// holds are the shares of transactions held open before they end, and
	// for how long (default defaultHolds).
	holds []hold
	// poisonBytes > 0: a poison message's payload is padded to this many
	// bytes, over the Kafka topics' max.message.bytes (kafkaMaxMessageBytes):
	// the broker refuses it, and the exactly-once forwarders must
	// dead-letter it.
	poisonBytes int
	// leaseTTL is the children's lease TTL (default leaseTTL).
	leaseTTL time.Duration
}

// hold: a share of the transactions is held open for min to max before it
// commits or rolls back.
type hold struct {
	share    float64
	min, max time.Duration
}

// defaultHolds are TestChaos's and TestChaosKafka's holds: 0.5% of the
// transactions held open for 3-8 s (longer than a lease), 5% for 0.3-2 s.
var defaultHolds = []hold{{0.005, 3 * time.Second, 8 * time.Second}, {0.05, 300 * time.Millisecond, 2 * time.Second}}

// kafkaMaxMessageBytes is the max.message.bytes of the Kafka topics of a
// scenario with poisonBytes.
const kafkaMaxMessageBytes = 64 << 10

func (sc scenario) publisherCount() int {
	if sc.publishers > 0 {
		return sc.publishers
	}
	return publishers
}

func (sc scenario) holdShares() []hold {
	if sc.holds != nil {
		return sc.holds
	}
	return defaultHolds
}

func (sc scenario) lease() time.Duration {
	if sc.leaseTTL > 0 {
		return sc.leaseTTL
	}
	return leaseTTL
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
	r.report = report
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
	// forcedPoison counts the poison messages committed on purpose (a
	// scenario with poisonBytes); wal counts what walStorm did.
	forcedPoison atomic.Int32
	wal          walCounts
	// report is the verifier's.
	report     Report
	injected   map[Kind]string // selftest: the key of each injected fault
	started    time.Time
	chaosEnded time.Time
	drainedAt  time.Time
	stopErrors []string
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
	// Acknowledged commits must survive the immediate restarts: with
	// synchronous_commit off they need not, and a "lost" message would be
	// the server's doing. fsync may stay off: the operating system does
	// not crash.
	settings := map[string]string{"synchronous_commit": "on", "log_min_messages": "log"}
	if r.sc.wal {
		settings["wal_level"] = "logical"
		settings["max_replication_slots"] = "4"
		settings["max_wal_senders"] = "8" // a frozen relay's stream lingers until its TakeoverTimeout
	}
	cluster, err := pgtest.StartCluster(ctx, pgcluster.Options{
		Settings: settings,
		Log: func(line string) {
			pgLogMu.Lock()
			defer pgLogMu.Unlock()
			fmt.Fprintln(pgLog, line)
		},
	})
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
	if r.sc.wal {
		if err := outbox.RegisterTopic(ctx, r.pool, schema, markerTopic, 1); err != nil {
			t.Fatal(err)
		}
		if err := relay.CreateSlot(ctx, r.pool, schema); err != nil {
			t.Fatal(err)
		}
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
		Group: role.group, FlakyRate: 0.01, WorkDelay: 4 * time.Millisecond, LeaseTTL: r.sc.lease(),
		Seed: r.seed, AtLeastOnce: role.atLeastOnce,
	}
	switch role.role {
	case RoleTransactional, RoleLeased:
		cfg.MaxAttempts = maxAttempts
		return cfg
	case RoleRelay:
		cfg.TakeoverTimeout = walTakeoverTimeout
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
	var topicConfigs map[string]string
	if r.sc.poisonBytes > 0 {
		topicConfigs = map[string]string{"max.message.bytes": fmt.Sprint(kafkaMaxMessageBytes)}
	}
	for name, n := range r.sc.kafkaTopics {
		r.kafkaTopics[name] = r.kafka.Topic(t, name, n, topicConfigs)
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
