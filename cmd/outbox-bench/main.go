// Command outbox-bench measures, in one process and on one machine, three
// ways of getting rows written in a transaction out to Kafka:
//
//	(a) ceiling: a plain multi-row INSERT of the same rows into a bare table
//	    (publishing only; nothing is forwarded);
//	(b) peer: watermill-sql v4's Publisher (default PostgreSQL schema
//	    adapter, inside the transaction) behind Watermill's
//	    components/forwarder, which relays to watermill-kafka's publisher;
//	(c) this project: the transactional outbox.Publisher, the Sequencer and
//	    forwarder.Forwarder with a kafka.Target (exactly once, its default);
//	(b') peer-tuned, not run unless named in -systems: (b) with
//	    watermill-sql's queue schema adapter, DeleteOnAck, batches of
//	    1,000 and a 10 ms poll;
//	(d) river, not run unless named in -systems: River (riverqueue/river
//	    with riverpgxv5) used as an outbox: InsertManyFastTx in the
//	    transaction, 100 workers producing each job to Kafka with
//	    watermill-kafka's publisher (see setupRiver for its settings);
//	(c') outbox-alo, not run unless named in -systems: (c) with the
//	    kafka.Target at least once (no Kafka transactions), for the cost of
//	    exactly-once delivery;
//	(e) outbox-wal, not run unless named in -systems: (c) in the log-based
//	    mode: the Publisher in outbox.ModeWAL writes into the WAL only and
//	    a relay.Relay streams the schema's logical slot into the log,
//	    forwarded as (c) is.
//
// It starts a throwaway durable PostgreSQL cluster (fsync and
// synchronous_commit on, pg_stat_statements loaded when available) and, per
// measured run, a fresh in-process Kafka broker (franz-go's kfake), and runs
// up to five phases (-phases):
//
//   - compare: first (a) and (c) publish alone, alternately, -publish-rounds
//     times per -per-tx value (at most 20,000 transactions each), reported
//     as medians and the (c)/(a) ratio of the medians. Then each system of
//     -systems publishes -messages messages with
//     -publishers goroutines, -per-tx messages per transaction. (b) and (c)
//     run twice: "steady" (the relay runs while publishing) and "backlog"
//     (publish with the relay stopped, then start it and time the drain).
//     Reports publish msg/s, end-to-end msg/s (from the first publish until
//     a read_committed consumer has read every message), drain msg/s, CPU
//     time of this process and of the PostgreSQL server, peak RSS, and the
//     ratios (c)/(a) and (c)/(b).
//   - latency: (b) and (c) (the latter with adaptive.LowLatency()) at each
//     open-loop offered load of -latency-loads msg/s for -latency-duration:
//     max(1, load/1000) messages per transaction, transactions started at
//     fixed times by -latency-publishers goroutines. A franz-go consumer
//     reads the Kafka topic; commit→broker latency is the time from COMMIT
//     returning to the consumer receiving the record (matched by the
//     metadata bench_n, a Kafka header). Reports p50/p90/p99/p99.9/max.
//     At each load (a), the plain INSERT, publishes alone at the same
//     schedule, nothing forwarded: its CPU per message is the ceiling the
//     others' is judged against.
//   - growth, (c) only: (i) -growth-history messages (4 publishers, 100/tx,
//     unpaced unless -growth-max-backlog) with the retention Vacuum on and
//     the consumer deleting what it consumed from the broker, with a point
//     (msg/s, latency, RSS, Go heap, log and pending rows and sizes) every
//     10% delivered; the same history again at a fixed offered load of
//     -growth-rate msg/s, for latency without a queue; (ii)
//     -growth-messages messages for each partition
//     count of -growth-partitions.
//   - idle: (b) and (c) (with adaptive.Default() and LowLatency()) with
//     the relay running and nothing published, for -idle-duration: the CPU
//     per second of the process and of the PostgreSQL server.
//   - soak, not run unless named: (c) at a steady -soak-rate msg/s for
//     -soak-duration with retention on (soak.go), a sample every
//     -soak-interval (latency, CPU per message, memory, goroutines,
//     connections, every outbox table's rows and size), each fitted to a
//     line after a warm-up and judged flat, bounded or growing.
//   - sources, not run unless named: one pipeline.Fleet over 1, 2 and 3
//     databases (-sources-counts), -messages in all as fast as they go,
//     and -sources-rate msg/s into each for -sources-duration, in
//     transactions of -sources-per-tx from -sources-publishers:
//     end-to-end msg/s, CPU per message, connections; then
//     a fleet over -sources-idle (50) databases, idle and with
//     -sources-trickle msg/s into each (sources.go).
//   - isolation, not run unless named: key-level isolation of the
//     Subscriber (outbox.KeyIsolation). -isolation-rate msg/s for 20 s over
//     -keys keys in up to 4 partitions, 1% of the keys failing from 5 s for
//     10 s; three runs: no failures, failures with isolation off, on. Reports
//     the other keys' handled msg/s during the window and their
//     commit→handled latency, in the partitions that hold a failing key.
//
// Flags:
//
//	-phases compare,latency,growth,idle   phases to run
//	-systems ceiling,peer,outbox     systems of the compare phase (also: peer-tuned, river, outbox-alo, outbox-wal)
//	-messages 200000                 messages per system and -per-tx value (compare)
//	-per-tx 100,1                    messages per transaction (compare)
//	-publishers 4                    publishers, one connection each (compare)
//	-publish-rounds 5                publish-only rounds of (a) and (c), interleaved, medians (compare)
//	-payload 256  -keys 1000         payload bytes, distinct partition keys
//	-partitions 16                   outbox and Kafka partitions (compare, latency, growth history)
//	-outbox-notify=true              (c): the Publisher's NOTIFY wakes the Sequencer
//	-latency-loads 1000,10000        offered loads, msg/s
//	-latency-duration 20s            how long each load is offered
//	-idle-duration 20s               how long each system idles (idle)
//	-latency-publishers 8            publishers (connections) of the latency phase
//	-growth-history 1000000          messages of the history run
//	-growth-max-backlog 0            history: publishers wait while more than this many are undelivered (0: unpaced)
//	-growth-rate 20000               offered msg/s of the paced history run (0: none)
//	-growth-partitions 1,4,16,64     partition counts of the partitions sweep
//	-growth-messages 200000          messages per partition count
//	-isolation-rate 5000             offered msg/s of the isolation phase
//	-soak-duration 1h  -soak-rate 1000  -soak-interval 30s  -soak-keep-for 1m  -soak-naptime 1m
//	-soak-table-defaults             soak on PostgreSQL's storage parameters, not Migrate's (to compare)
//	-max-drain 15m                   give up waiting for a run's messages at the broker after this long
//	-out outbox-bench-results        output directory
//	-cpuprofile FILE                 a CPU profile of the whole run (go tool pprof)
//	-sources-counts 1,2,3            sources: databases of the throughput runs (0: none)
//	-sources-idle 50  -sources-trickle 1  sources: the many-sources run
//	-sources-settle 5s               sources: the fleet runs this long before its idle CPU is measured
//	-sources-idle-profile FILE       a CPU profile of the many-sources run's idle window
//	-smoke                           tiny sizes, all phases well under 90 s; for CI
//	-rewrite                         measure nothing; render -out's outputs again from its results.json
//	-medians d1,d2,d3                measure nothing; write -out/medians.md, each target's median over those runs
//
//	go run ./cmd/outbox-bench                      # everything, full sizes
//	go run ./cmd/outbox-bench -smoke               # tiny sizes, for CI
//	go run ./cmd/outbox-bench -phases latency -latency-loads 1000
//	go run ./cmd/outbox-bench -phases compare -systems outbox,outbox-alo -per-tx 100 -publish-rounds 0
//	go run ./cmd/outbox-bench -phases isolation
//	go run ./cmd/outbox-bench -phases soak -soak-duration 1h -soak-rate 1000
//	go run ./cmd/outbox-bench -phases sources
//
// Results go to -out: results.json (every figure, samples, latency CDFs,
// growth points, top statements), results.md (the tables), throughput.png
// (compare: rate at the broker over time, steady and drain), latency.png
// (commit→broker latency CDF), growth.png (history and partition curves)
// statements.md (pg_stat_statements' top statements per run of (b) and
// (c)) and, after a soak, soak.png (every sampled metric over time). Progress goes to stdout. See docs/comparison.md.
//
// The exit status is 1 when a run did not get all its messages to the
// broker within -max-drain (after the outputs are written), 2 for bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Phases, in the order they run.
const (
	phaseCompare = "compare"
	phaseLatency = "latency"
	phaseGrowth  = "growth"
	// phaseIsolation is not run unless named in -phases.
	phaseIsolation = "isolation"
	phaseIdle      = "idle"
	// phaseSoak is not run unless named in -phases.
	phaseSoak = "soak"
	// phaseSources is not run unless named in -phases.
	phaseSources = "sources"
)

// maxTracked bounds the messages of a latency or growth run: each has its
// commit and receive times in memory (16 bytes per message).
const maxTracked = 20_000_000

// config holds the parsed flags.
type config struct {
	phases     []string
	systems    []string
	messages   int
	payload    int
	keys       int
	partitions int
	perTx      []int
	publishers int
	maxDrain   time.Duration
	out        string
	smoke      bool
	// outboxNotify leaves the outbox Publisher's NOTIFY on (the default).
	outboxNotify bool
	// forwardOnly registers (c)'s topic with outbox.ForwardOnly: its
	// messages go from pending to Kafka without the log.
	forwardOnly bool
	// relayPace is (e)'s relay.Config.MinAppendInterval (0: its default).
	relayPace time.Duration

	isolationRate int
	cpuProfile    string
	// sourcesIdleProfile is the file of a CPU profile of the
	// many-sources run's idle window ("": none).
	sourcesIdleProfile string
	latencyLoads       []int
	latencyDuration    time.Duration
	idleDuration       time.Duration
	latencyPublishers  int

	growthHistory    int
	growthMaxBacklog int
	growthRate       int
	publishRounds    int
	rewrite          bool
	medians          string
	growthPartitions []int
	growthMessages   int

	soakDuration time.Duration
	soakRate     int
	soakInterval time.Duration
	soakKeepFor  time.Duration
	soakNaptime  time.Duration
	// soakTableDefaults undoes Migrate's storage parameters, to compare.
	soakTableDefaults bool

	sourcesCounts     []int
	sourcesSettle     time.Duration
	sourcesPerTx      int
	sourcesPublishers int
	sourcesRate       float64
	sourcesDuration   time.Duration
	sourcesIdle       int
	sourcesTrickle    float64
}

func (c *config) has(phase string) bool { return slices.Contains(c.phases, phase) }

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-bench:", err)
		os.Exit(2)
	}
	if cfg.cpuProfile != "" {
		stop, perr := startCPUProfile(cfg.cpuProfile)
		if perr != nil {
			fmt.Fprintln(os.Stderr, "outbox-bench:", perr)
			os.Exit(1)
		}
		defer stop()
	}
	switch {
	case cfg.medians != "":
		err = medians(strings.Split(cfg.medians, ","), cfg.out)
	case cfg.rewrite:
		err = rewrite(cfg.out)
	default:
		err = run(context.Background(), cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-bench:", err)
		os.Exit(1) //nolint:gocritic // the profile of a failed run is not needed
	}
}

// startCPUProfile profiles the process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// rewrite renders results.md, statements.md and the PNGs of dir again from
// its results.json, without measuring anything.
func rewrite(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	var res results
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, "results.json"), err)
	}
	if res.Soak != nil {
		res.Soak.Trends = res.Soak.trends() // judged by this release's rules
	}
	return res.write(dir)
}

// parseFlags parses and validates the command line; -smoke replaces the
// sizes (not -phases, -systems or -out).
func parseFlags(args []string) (config, error) {
	var cfg config
	var phases, systems, perTx, loads, partitions, sourceCounts string
	fs := flag.NewFlagSet("outbox-bench", flag.ContinueOnError)
	fs.StringVar(&phases, "phases", "compare,latency,growth,idle", "phases to run: compare, latency, growth, idle, isolation, soak, sources (comma-separated)")
	fs.StringVar(&sourceCounts, "sources-counts", "1,2,3", "sources: the numbers of databases of the throughput runs (0: none, the many-sources run only)")
	fs.IntVar(&cfg.sourcesPerTx, "sources-per-tx", 10, "sources: messages per transaction of the throughput runs")
	fs.Float64Var(&cfg.sourcesRate, "sources-rate", 2000, "sources: msg/s offered to each source in the same-per-source runs")
	fs.DurationVar(&cfg.sourcesDuration, "sources-duration", 10*time.Second, "sources: how long the same-per-source runs publish")
	fs.IntVar(&cfg.sourcesPublishers, "sources-publishers", 6, "sources: publishers of the throughput runs, split among the sources (6: 6, 3+3, 2+2+2)")
	fs.IntVar(&cfg.sourcesIdle, "sources-idle", 50, "sources: databases of the many-sources run (idle, then a trickle); 0: none")
	fs.DurationVar(&cfg.sourcesSettle, "sources-settle", 5*time.Second, "sources: how long the many-sources run's fleet runs before its idle CPU is measured (past pipeline.DefaultTrimIdleAfter for the pools' trim to show)")
	fs.Float64Var(&cfg.sourcesTrickle, "sources-trickle", 1, "sources: msg/s into each database of the many-sources run after its idle measurement; 0: none")
	fs.DurationVar(&cfg.soakDuration, "soak-duration", time.Hour, "soak: how long the steady load runs")
	fs.IntVar(&cfg.soakRate, "soak-rate", 1000, "soak: offered load in msg/s (max(1, rate/1000) per transaction)")
	fs.DurationVar(&cfg.soakInterval, "soak-interval", 30*time.Second, "soak: time between samples")
	fs.DurationVar(&cfg.soakKeepFor, "soak-keep-for", time.Minute, "soak: the retention Vacuum's KeepFor")
	fs.BoolVar(&cfg.soakTableDefaults, "soak-table-defaults", false, "soak: run the tables on PostgreSQL's storage parameters instead of those Migrate sets, to compare")
	fs.DurationVar(&cfg.soakNaptime, "soak-naptime", time.Minute, "soak: the server's autovacuum_naptime when the soak runs alone (PostgreSQL's default is 1 min; the other phases run at 5 s)")
	fs.IntVar(&cfg.isolationRate, "isolation-rate", 5000, "isolation: offered load in msg/s")
	fs.StringVar(&systems, "systems", "ceiling,peer,outbox", "systems of the compare phase: ceiling, peer, peer-tuned, river, outbox, outbox-alo, outbox-wal (comma-separated)")
	fs.IntVar(&cfg.messages, "messages", 200000, "compare: messages per system and per -per-tx value")
	fs.IntVar(&cfg.payload, "payload", 256, "payload bytes per message")
	fs.IntVar(&cfg.keys, "keys", 1000, "distinct partition keys")
	fs.IntVar(&cfg.partitions, "partitions", 16, "partitions of the outbox topic and of the Kafka topics (compare, latency, growth history)")
	fs.StringVar(&perTx, "per-tx", "100,1", "compare: messages per transaction; a comma-separated list runs each")
	fs.IntVar(&cfg.publishers, "publishers", 4, "compare: concurrent publishers, one connection each")
	fs.DurationVar(&cfg.maxDrain, "max-drain", 15*time.Minute, "give up waiting for a run's messages at the broker after this long (the result is then marked incomplete)")
	fs.StringVar(&cfg.out, "out", "outbox-bench-results", "directory for results.json, results.md, statements.md and the PNGs")
	fs.BoolVar(&cfg.forwardOnly, "outbox-forward-only", false, "(c), both modes, and the sources phase: register the topic with outbox.ForwardOnly (no log copy: the forwarder reads pending, where the relay puts them in the log-based mode)")
	fs.BoolVar(&cfg.outboxNotify, "outbox-notify", true, "(c): the Publisher sends NOTIFY to wake the Sequencer (its default); false leaves the Sequencer to its poll interval")
	fs.DurationVar(&cfg.relayPace, "relay-pace", 0, "(e): the relay's MinAppendInterval (0: the forwarder's profile's, adaptive.Tuning.AppendInterval; negative: no floor)")
	fs.StringVar(&loads, "latency-loads", "1000,10000", "latency: offered loads in msg/s (comma-separated)")
	fs.DurationVar(&cfg.latencyDuration, "latency-duration", 20*time.Second, "latency: how long each load is offered")
	fs.DurationVar(&cfg.idleDuration, "idle-duration", 20*time.Second, "idle: how long each system's idle CPU is measured")
	fs.IntVar(&cfg.latencyPublishers, "latency-publishers", 8, "latency: publisher goroutines (one connection each)")
	fs.IntVar(&cfg.growthHistory, "growth-history", 1000000, "growth: messages of the history run (retention on)")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fs.StringVar(&cfg.sourcesIdleProfile, "sources-idle-profile", "", "sources: write a CPU profile of the many-sources run's idle window to this file (go tool pprof; not with -cpuprofile)")
	fs.StringVar(&cfg.medians, "medians", "", "measure nothing: write -out/medians.md, the median of every target over the runs whose -out directories are listed (comma-separated)")
	fs.BoolVar(&cfg.rewrite, "rewrite", false, "measure nothing: render results.md, statements.md and the PNGs of -out again from its results.json")
	fs.IntVar(&cfg.publishRounds, "publish-rounds", 5, "compare: rounds of publish-only runs of (a) and (c), interleaved, reported as medians (0: none)")
	fs.IntVar(&cfg.growthRate, "growth-rate", 20000, "growth: offered load (msg/s) of the second, paced history run, which shows latency as the history grows (0: no paced run)")
	fs.IntVar(&cfg.growthMaxBacklog, "growth-max-backlog", 0, "growth: publishers wait while more than this many messages are not yet at the consumer (0: unpaced)")
	fs.StringVar(&partitions, "growth-partitions", "1,4,16,64", "growth: partition counts (comma-separated)")
	fs.IntVar(&cfg.growthMessages, "growth-messages", 200000, "growth: messages per partition count")
	fs.BoolVar(&cfg.smoke, "smoke", false, "tiny sizes (compare 2,000 messages; loads 200 and 1000 msg/s for 2 s; history 20,000; partitions 1,4 with 5,000 each); for CI")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.phases, err = parseNames("-phases", phases, phaseCompare, phaseLatency, phaseGrowth, phaseIsolation, phaseIdle, phaseSoak, phaseSources); err != nil {
		return cfg, err
	}
	if cfg.systems, err = parseNames("-systems", systems, sysCeiling, sysPeer, sysPeerTuned, sysRiver, sysOutbox, sysOutboxALO, sysOutboxWAL); err != nil {
		return cfg, err
	}
	if cfg.perTx, err = parseInts("-per-tx", perTx, 1, 1<<20); err != nil {
		return cfg, err
	}
	if cfg.latencyLoads, err = parseInts("-latency-loads", loads, 1, 1_000_000); err != nil {
		return cfg, err
	}
	if cfg.growthPartitions, err = parseInts("-growth-partitions", partitions, 1, 1024); err != nil {
		return cfg, err
	}
	if sourceCounts == "0" { // the many-sources run only
		cfg.sourcesCounts = nil
	} else if cfg.sourcesCounts, err = parseInts("-sources-counts", sourceCounts, 1, 64); err != nil {
		return cfg, err
	}
	if cfg.smoke {
		cfg.messages = 2000
		cfg.maxDrain = 20 * time.Second
		cfg.latencyLoads = []int{200, 1000}
		cfg.latencyDuration = 2 * time.Second
		cfg.idleDuration = 2 * time.Second
		cfg.growthHistory = 20000
		cfg.growthRate = min(cfg.growthRate, 10000)
		cfg.publishRounds = min(cfg.publishRounds, 2)
		cfg.growthPartitions = []int{1, 4}
		cfg.growthMessages = 5000
		cfg.sourcesIdle = min(cfg.sourcesIdle, 5)
		cfg.sourcesDuration = time.Second
		cfg.soakDuration = 12 * time.Second
		cfg.soakInterval = time.Second
		cfg.soakRate = min(cfg.soakRate, 500)
	}
	return cfg, cfg.validate()
}

func (c *config) validate() error {
	switch {
	case c.messages < 1, c.keys < 1, c.publishers < 1, c.latencyPublishers < 1:
		return fmt.Errorf("-messages, -keys, -publishers and -latency-publishers must be at least 1")
	case c.payload < 0:
		return fmt.Errorf("-payload must not be negative")
	case c.partitions < 1 || c.partitions > 1024:
		return fmt.Errorf("-partitions must be 1..1024")
	case c.maxDrain <= 0 || c.latencyDuration <= 0 || c.idleDuration <= 0:
		return fmt.Errorf("-max-drain, -latency-duration and -idle-duration must be positive")
	case c.latencyDuration > time.Hour:
		return fmt.Errorf("-latency-duration must be at most 1h")
	case c.growthHistory < 10:
		return fmt.Errorf("-growth-history must be at least 10 (a point per 10%%)")
	case c.isolationRate < 10 || c.isolationRate > 100_000:
		return fmt.Errorf("-isolation-rate must be 10..100000")
	case c.growthMessages < 1:
		return fmt.Errorf("-growth-messages must be at least 1")
	case c.publishRounds < 0:
		return fmt.Errorf("-publish-rounds must not be negative")
	case c.growthRate < 0:
		return fmt.Errorf("-growth-rate must not be negative")
	case c.growthMaxBacklog < 0:
		return fmt.Errorf("-growth-max-backlog must not be negative")
	case c.out == "":
		return fmt.Errorf("-out must not be empty")
	case c.sourcesSettle < 0:
		return fmt.Errorf("-sources-settle must not be negative")
	case c.cpuProfile != "" && c.sourcesIdleProfile != "":
		return fmt.Errorf("-cpuprofile and -sources-idle-profile cannot both be set (one CPU profile at a time)")
	case c.soakInterval < 100*time.Millisecond || c.soakDuration < 6*c.soakInterval:
		return fmt.Errorf("-soak-interval must be at least 100ms and -soak-duration at least 6 intervals (a trend needs samples)")
	case c.soakRate < 1 || c.soakRate > 100_000:
		return fmt.Errorf("-soak-rate must be 1..100000")
	case c.soakKeepFor < 0 || c.soakNaptime < time.Second:
		return fmt.Errorf("-soak-keep-for must not be negative and -soak-naptime must be at least 1s")
	case int64(c.soakRate)*int64(c.soakDuration/time.Second) > maxTracked:
		return fmt.Errorf("-soak-rate × -soak-duration is more than %d messages", maxTracked)
	}
	for _, l := range c.latencyLoads {
		// The commit and receive times are kept per message.
		if n := int64(l) * int64(c.latencyDuration/time.Millisecond) / 1000; n > maxTracked {
			return fmt.Errorf("-latency-loads %d for -latency-duration %v is %d messages; at most %d", l, c.latencyDuration, n, maxTracked)
		}
		if latencyTxs(l, c.latencyDuration) < 1 {
			return fmt.Errorf("-latency-loads %d: less than one transaction in -latency-duration %v", l, c.latencyDuration)
		}
	}
	if c.growthHistory > maxTracked || c.growthMessages > maxTracked {
		return fmt.Errorf("-growth-history and -growth-messages must be at most %d", maxTracked)
	}
	return nil
}

// parseNames splits a comma-separated list and checks each name against
// allowed; the result keeps allowed's order, without repeats.
func parseNames(flagName, s string, allowed ...string) ([]string, error) {
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(allowed, f) {
			return nil, fmt.Errorf("bad %s value %q (allowed: %s)", flagName, f, strings.Join(allowed, ", "))
		}
		seen[f] = true
	}
	var out []string
	for _, a := range allowed {
		if seen[a] {
			out = append(out, a)
		}
	}
	return out, nil
}

// parseInts splits a comma-separated list of integers in lo..hi, keeping
// their order and dropping repeats.
func parseInts(flagName, s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("bad %s value %q (want an integer %d..%d)", flagName, f, lo, hi)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}
