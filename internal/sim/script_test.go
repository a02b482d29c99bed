package sim

import (
	"testing"
	"testing/synctest"
	"time"
)

// scriptSeeds is how many seeds each scripted case runs (the scheduler
// draws what the script leaves open).
const scriptSeeds = 25

func TestScenarioFenceBeforeRecord(t *testing.T) {
	runScenario(t, scriptShape(1), scenarioFenceBeforeRecord)
}

func TestScenarioTakeOverAfterEachStart(t *testing.T) {
	sh := scriptShape(2)
	sh.linger = 50 * time.Millisecond // the batches meet in one round
	runScenario(t, sh, scenarioTakeOverAfterEachStart)
}

func TestScenarioLateCommitAfterAnUnrecordedRound(t *testing.T) {
	sh := scriptShape(1)
	sh.direct = true
	runScenario(t, sh, scenarioLateCommitAfterAnUnrecordedRound)
}

func runScenario(t *testing.T, sh shape, play func(sc *script)) {
	for seed := uint64(1); seed <= scriptSeeds; seed++ {
		var res Result
		synctest.Test(t, func(t *testing.T) {
			res = runScript(seed, sh, Options{}, play)
		})
		if !res.OK() {
			again := Result{}
			synctest.Test(t, func(t *testing.T) {
				again = runScript(seed, sh, Options{Trace: *flagVerbose}, play)
			})
			t.Fatalf("seed %d: %v\n%s", seed, res, again.Trace)
		}
	}
}
