package sim

import (
	"cmp"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var (
	flagSchedules = flag.Int("sim.schedules", 10000, "how many schedules TestSimulation runs: the fixed seeds 1 to fixedSeeds, then seeds from -sim.base")
	flagBase      = flag.Uint64("sim.base", 0, "the first seed of TestSimulation's schedules after the fixed ones (0: drawn from the clock, and printed)")
	flagSeed      = flag.Uint64("sim.seed", 0, "run this one schedule only (a failing seed printed by TestSimulation)")
	flagVerbose   = flag.Bool("sim.v", false, "print the trace of -sim.seed's schedule")
	flagNoConvert = flag.Bool("sim.noconvert", false, "the Kafka client never ends a commit as an abort")
)

// TestSimulation runs -sim.schedules schedules of the forwarding protocol
// (see the package documentation) and fails on any broken invariant,
// printing the seed that replays it: go test ./internal/sim -run
// TestSimulation -sim.seed=N (-sim.v for its trace).
func TestSimulation(t *testing.T) {
	if *flagSeed != 0 {
		synctest.Test(t, func(t *testing.T) {
			res := Run(*flagSeed, Options{Trace: *flagVerbose, NoConversion: *flagNoConvert})
			if *flagVerbose {
				t.Logf("trace:\n%s", res.Trace)
			}
			t.Log(res)
			if !res.OK() {
				t.Fail()
			}
		})
		return
	}
	base := *flagBase
	if base == 0 {
		base = uint64(time.Now().UnixNano()) | 1<<62 // far from the fixed seeds
	}
	n := *flagSchedules
	if testing.Short() && n > 1000 {
		n = 1000
	}
	fixed := min(n, fixedSeeds)
	// seedOf is the seed of schedule k: the fixed seeds first (the same in
	// every run: a bug they find fails every run), then new ones.
	seedOf := func(k int64) uint64 {
		if k < int64(fixed) {
			return uint64(k) + 1
		}
		return base + uint64(k-int64(fixed))
	}
	t.Logf("%d schedules: seeds 1 to %d, then %d from seed %d (again: -sim.base=%d -sim.schedules=%d)", n, fixed, n-fixed, base, base, n)
	var (
		next     atomic.Int64
		mu       sync.Mutex
		failed   []Result
		totals   Result
		started  = time.Now()
		workers  = runtime.GOMAXPROCS(0)
		finished atomic.Int64
	)
	for i := range workers {
		t.Run(fmt.Sprintf("worker-%d", i), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				for {
					k := next.Add(1) - 1
					if k >= int64(n) {
						return
					}
					seed := seedOf(k)
					res := Run(seed, Options{NoConversion: *flagNoConvert})
					finished.Add(1)
					mu.Lock()
					totals.Steps += res.Steps
					totals.Published += res.Published
					totals.InKafka += res.InKafka
					totals.Dead += res.Dead
					totals.Kills += res.Kills
					totals.Freezes += res.Freezes
					totals.Converted += res.Converted
					totals.Crashes += res.Crashes
					totals.Outages += res.Outages
					totals.Combined += res.Combined
					totals.LegacyTakeovers += res.LegacyTakeovers
					if !res.OK() {
						failed = append(failed, res)
					}
					mu.Unlock()
				}
			})
		})
	}
	t.Cleanup(func() {
		t.Logf("%d schedules in %v: %d steps, %d messages published, %d records in Kafka, %d dead-lettered, %d kills, %d freezes, %d commits ended as aborts by the client, %d database crashes, %d Kafka outages, %d committed transactions of several outbox partitions, %d takeovers of partitions written before writer records",
			finished.Load(), time.Since(started).Round(time.Millisecond), totals.Steps, totals.Published, totals.InKafka, totals.Dead, totals.Kills, totals.Freezes, totals.Converted, totals.Crashes, totals.Outages, totals.Combined, totals.LegacyTakeovers)
		if len(failed) > 0 {
			slices.SortFunc(failed, func(a, b Result) int { return cmp.Compare(a.Seed, b.Seed) })
			t.Errorf("%d of %d schedules failed; the first has seed %d", len(failed), finished.Load(), failed[0].Seed)
		}
		for i, r := range failed {
			if i == 5 {
				t.Errorf("... and %d more failing schedules", len(failed)-5)
				break
			}
			t.Errorf("%v\nreplay: go test ./internal/sim -run TestSimulation -sim.seed=%d -sim.v", r, r.Seed)
		}
	})
}

// fixedSeeds is how many schedules of every run have the seeds 1, 2, …:
// the rest are new in each run.
const fixedSeeds = 2000

// TestSimulationFindsALossOfAnUnconfirmedCommit keeps the simulator's
// teeth: with the Kafka driver trusting a nil EndTxn as a commit (the
// product before issue 39's fix), the client's commit-turned-abort loses
// messages, and a fixed set of schedules must find it.
func TestSimulationFindsALossOfAnUnconfirmedCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for seed := uint64(1); seed <= 2000; seed++ {
			res := Run(seed, Options{TrustEndTxn: true})
			for _, f := range res.Failures {
				if strings.Contains(f, "LOST") {
					t.Logf("found at schedule %d: %s", seed, f)
					return
				}
			}
		}
		t.Fatal("2000 schedules with a driver that trusts a nil EndTxn found no lost message: the simulator lost its teeth (is the client still made to end commits as aborts?)")
	})
}

// TestSimulationReplaysExactly runs schedules twice and compares their
// traces: a seed must replay the same schedule, call for call, or a
// failing seed would prove nothing when replayed.
func TestSimulationReplaysExactly(t *testing.T) {
	for seed := uint64(1); seed <= *replaySeeds; seed++ {
		var first, second Result
		synctest.Test(t, func(t *testing.T) { first = Run(seed, Options{Trace: true}) })
		synctest.Test(t, func(t *testing.T) { second = Run(seed, Options{Trace: true}) })
		if first.Trace != second.Trace {
			a, b := strings.Split(first.Trace, "\n"), strings.Split(second.Trace, "\n")
			for i := range min(len(a), len(b)) {
				if a[i] != b[i] {
					t.Fatalf("seed %d replayed differently at line %d of its trace:\n  first:  %s\n  second: %s", seed, i+1, a[i], b[i])
				}
			}
			t.Fatalf("seed %d replayed differently: %d lines, then %d", seed, len(a), len(b))
		}
		if first.String() != second.String() {
			t.Fatalf("seed %d replayed differently:\n  %v\n  %v", seed, first, second)
		}
	}
}

// replaySeeds is how many seeds TestSimulationReplaysExactly replays.
var replaySeeds = flag.Uint64("sim.replays", 40, "how many seeds TestSimulationReplaysExactly runs twice")
