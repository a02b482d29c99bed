package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/internal/worker"
)

const hour = time.Hour

// A batch worker with a 4 h polling interval normally works 2 h and goes
// idle. When one run overruns the 4 h window it answers Proceed, and the
// next run must start immediately instead of after another idle interval.
func TestLongIntervalWorkerReschedulesWhenWorkOverrunsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		const threshold = 4 * hour
		work := []time.Duration{2 * hour, 5 * hour, 1 * hour, time.Millisecond}
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: 4 * hour}},
			worker.ActionFunc(func(ctx context.Context) (worker.Directive, error) {
				i := h.mark()
				d := work[min(i, len(work)-1)]
				time.Sleep(d)
				if d > threshold {
					return worker.Proceed(), nil
				}
				return worker.Idle(), nil
			}))
		time.Sleep(16*hour + 30*time.Minute)
		// 0: works 2h, idles 4h; 6h: works 5h (overrun) -> proceed;
		// 11h: at once, works 1h, idles 4h; 16h: next run.
		requireStarts(t, h.stop(), 0, 6*hour, 11*hour, 16*hour)
	})
}

// An idle worker with a 5 h safety-net interval wakes as soon as it is poked.
func TestPokeWakesIdleWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		poker := worker.NewPoker()
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: 5 * hour}, Poker: poker},
			scripted(h, step{dir: worker.Idle()}))
		time.Sleep(hour)
		poker.Poke()
		time.Sleep(hour)
		poker.Poke()
		time.Sleep(2 * hour)
		requireStarts(t, h.stop(), 0, hour, 2*hour)
	})
}

// Pokes from several independent sources all wake the worker.
func TestPokesFromManySourcesWakeWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		poker := worker.NewPoker()
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: 100 * hour}, Poker: poker},
			scripted(h, step{dir: worker.Idle()}))
		var sources sync.WaitGroup
		for i := 1; i <= 3; i++ {
			sources.Go(func() {
				time.Sleep(time.Duration(i) * hour)
				poker.Poke()
			})
		}
		sources.Wait()
		time.Sleep(3 * hour)
		requireStarts(t, h.stop(), 0, hour, 2*hour, 3*hour)
	})
}

// Many pokes while the worker is busy coalesce into one extra call.
func TestPokesCoalesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		poker := worker.NewPoker()
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: hour}, Poker: poker},
			scripted(h, step{dir: worker.Idle(), work: 10 * time.Second}))
		time.Sleep(time.Second) // first call is busy until 10s
		for range 100 {
			poker.Poke()
		}
		time.Sleep(30 * time.Minute)
		// One wake at 10s for all 100 pokes; the call at 10s runs until 20s,
		// then the worker idles for the full hour.
		requireStarts(t, h.stop(), 0, 10*time.Second)
	})
}

// A nil Poker is valid and ignores pokes.
func TestNilPokerIgnoresPokes(t *testing.T) {
	var p *worker.Poker
	p.Poke() // must not panic or block
}

// Errors back off exponentially; the first success resets the backoff.
func TestTransientErrorsBackOffThenRecover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		errTimeout := errors.New("db timeout")
		h.start(worker.Config{
			Name:    "flaky",
			Pacing:  tune.Pacing{IdleInterval: hour},
			Backoff: worker.BackoffConfig{Base: time.Second, Max: hour},
		}, scripted(h,
			step{err: errTimeout},              // backoff 1s
			step{err: errTimeout},              // backoff 2s
			step{err: errTimeout},              // backoff 4s
			step{dir: worker.Proceed()},        // reset; zero pacing: at once
			step{err: errTimeout},              // backoff 1s again, not 8s
			step{dir: worker.Sleep(10 * hour)}, // quiet from here on
		))
		time.Sleep(30 * time.Minute)
		s := time.Second
		requireStarts(t, h.stop(), 0, 1*s, 3*s, 7*s, 7*s, 8*s)

		got := h.recordedFailures()
		want := []struct {
			n     int
			retry time.Duration
		}{{1, s}, {2, 2 * s}, {3, 4 * s}, {1, s}}
		if len(got) != len(want) {
			t.Fatalf("got %d failure reports, want %d: %+v", len(got), len(want), got)
		}
		for i, f := range got {
			if f.Worker != "flaky" || !errors.Is(f.Err, errTimeout) || f.Consecutive != want[i].n || f.RetryIn != want[i].retry {
				t.Fatalf("failure %d = %+v, want worker flaky, consecutive %d, retry in %v", i, f, want[i].n, want[i].retry)
			}
		}
	})
}

func TestErrorBackoffIsCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.start(worker.Config{
			Pacing:  tune.Pacing{IdleInterval: hour},
			Backoff: worker.BackoffConfig{Base: time.Second, Max: 5 * time.Second},
		}, scripted(h, step{err: errors.New("down")}))
		time.Sleep(20 * time.Second)
		s := time.Second
		requireStarts(t, h.stop(), 0, 1*s, 3*s, 7*s, 12*s, 17*s)
		for i, f := range h.recordedFailures() {
			want := min(time.Second<<i, 5*time.Second)
			if f.RetryIn != want || f.Consecutive != i+1 {
				t.Fatalf("failure %d: consecutive %d, retry in %v; want %d, %v", i, f.Consecutive, f.RetryIn, i+1, want)
			}
		}
	})
}

// With a Jitter, each backoff is spread by it, and the wait reported is the
// one waited.
func TestErrorBackoffIsSpreadByTheJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.start(worker.Config{
			Pacing:  tune.Pacing{IdleInterval: hour},
			Backoff: worker.BackoffConfig{Base: 4 * time.Second, Max: hour, Jitter: func(d time.Duration) time.Duration { return d * 3 / 4 }},
		}, scripted(h, step{err: errors.New("down")}, step{err: errors.New("down")}, step{dir: worker.Sleep(10 * hour)}))
		time.Sleep(time.Minute)
		s := time.Second
		requireStarts(t, h.stop(), 0, 3*s, 9*s)
		for i, f := range h.recordedFailures() {
			if want := (4 * time.Second << i) * 3 / 4; f.RetryIn != want {
				t.Fatalf("failure %d: retry in %v, want the jittered %v", i, f.RetryIn, want)
			}
		}
	})
}

// Consecutive Proceeds ramp the wait down from ActiveInterval to
// MinInterval; an Idle, a Sleep or an error starts the ramp over.
func TestPacingRampsDownAndResets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		h := newHarness(t)
		poker := worker.NewPoker()
		p, i := worker.Proceed(), worker.Idle()
		h.start(worker.Config{
			Pacing: tune.Pacing{MinInterval: 10 * ms, ActiveInterval: 50 * ms, RampStep: 10 * ms, IdleInterval: hour},
			Poker:  poker,
		}, scripted(h,
			step{dir: p}, step{dir: p}, step{dir: p}, step{dir: p}, step{dir: p}, step{dir: p}, // 50 40 30 20 10 10
			step{dir: i},               // at 160ms; poked at 1s
			step{dir: p}, step{dir: p}, // 50 40: ramp restarted
			step{dir: worker.Sleep(100 * ms)}, // sleep
			step{dir: p}, step{dir: p},        // 50 40 again
			step{err: errors.New("x")},                // backoff 1s (default)
			step{dir: p}, step{dir: p}, step{dir: i}), // 50 40 then idle
		)
		time.Sleep(time.Second)
		poker.Poke()
		time.Sleep(5 * time.Second)
		requireStarts(t, h.stop(),
			0, 50*ms, 90*ms, 120*ms, 140*ms, 150*ms, 160*ms,
			1000*ms, 1050*ms, 1090*ms,
			1190*ms, 1240*ms, 1280*ms,
			2280*ms, 2330*ms, 2370*ms)
	})
}

// A self-scheduling worker sleeps exactly as asked; pokes do not cut a
// Sleep short.
func TestSleepDirectiveSelfSchedulesAndIgnoresPokes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		poker := worker.NewPoker()
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: 10 * time.Minute}, Poker: poker},
			scripted(h, step{dir: worker.Sleep(hour)}))
		for range 21 { // a poke every 10 minutes for 3.5 hours
			time.Sleep(10 * time.Minute)
			poker.Poke()
		}
		requireStarts(t, h.stop(), 0, hour, 2*hour, 3*hour)
	})
}

// A poke that arrives during a Sleep is kept: if the next call finds nothing
// to do, the pending poke makes the worker look again at once.
func TestPokeDuringSleepIsKeptForNextIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		poker := worker.NewPoker()
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: hour}, Poker: poker},
			scripted(h, step{dir: worker.Sleep(time.Minute)}, step{dir: worker.Idle()}))
		time.Sleep(30 * time.Second)
		poker.Poke()
		time.Sleep(30 * time.Minute)
		requireStarts(t, h.stop(), 0, time.Minute, time.Minute)
	})
}

func TestNonPositiveSleepRunsAgainAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: hour}},
			scripted(h, step{dir: worker.Sleep(-time.Second)}, step{dir: worker.Sleep(0)}, step{dir: worker.Idle()}))
		time.Sleep(time.Minute)
		requireStarts(t, h.stop(), 0, 0, 0)
	})
}

// A panic in Execute is recovered, reported as a *PanicError, backed off
// like an error, and the worker keeps running. A sibling worker sharing the
// same bulkhead is unaffected: the panicking call's slot is released.
func TestPanicIsRecoveredAndWorkerContinues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bulkhead, err := worker.NewBulkhead(1)
		if err != nil {
			t.Fatal(err)
		}
		bad, good := newHarness(t), newHarness(t)
		cause := errors.New("segfault in row processor")
		bad.start(worker.Config{
			Name: "bad", Bulkhead: bulkhead,
			Pacing:  tune.Pacing{IdleInterval: time.Second},
			Backoff: worker.BackoffConfig{Base: 2 * time.Second, Max: time.Minute},
		}, worker.ActionFunc(func(ctx context.Context) (worker.Directive, error) {
			switch bad.mark() {
			case 0:
				panic(cause)
			case 1:
				panic("plain string")
			}
			return worker.Idle(), nil
		}))
		good.start(worker.Config{Name: "good", Bulkhead: bulkhead, Pacing: tune.Pacing{IdleInterval: time.Second}},
			scripted(good, step{dir: worker.Idle()}))

		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := bulkhead.InUse(); n != 0 {
			t.Fatalf("bulkhead has %d slots in use while both workers idle", n)
		}
		badCalls, goodCalls := bad.stop(), good.stop()
		// Panics at 0 (retry in 2s) and 2s (retry in 4s), then idle every second.
		requireStarts(t, badCalls, 0, 2*time.Second, 6*time.Second, 7*time.Second, 8*time.Second, 9*time.Second, 10*time.Second)
		if len(goodCalls) != 11 {
			t.Fatalf("good worker made %d calls in 10s, want 11 (every second)", len(goodCalls))
		}

		failures := bad.recordedFailures()
		if len(failures) != 2 {
			t.Fatalf("got %d failure reports, want 2", len(failures))
		}
		var pe *worker.PanicError
		if !errors.As(failures[0].Err, &pe) || pe.Value != cause || len(pe.Stack) == 0 {
			t.Fatalf("first failure %v is not a *PanicError with value and stack", failures[0].Err)
		}
		if !errors.Is(failures[0].Err, cause) {
			t.Fatal("a panic with an error value must unwrap to that error")
		}
		if !strings.Contains(failures[1].Err.Error(), "plain string") || failures[1].Consecutive != 2 || failures[1].RetryIn != 4*time.Second {
			t.Fatalf("second failure = %+v", failures[1])
		}
		if len(good.recordedFailures()) != 0 {
			t.Fatal("good worker reported failures")
		}
	})
}

// Four workers share a bulkhead of two and one poker: never more than two
// execute at once, and the others wait for a free slot.
func TestBulkheadLimitsConcurrencyAcrossWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bulkhead, err := worker.NewBulkhead(2)
		if err != nil {
			t.Fatal(err)
		}
		poker := worker.NewPoker()
		var running, peak atomic.Int32
		harnesses := make([]*harness, 4)
		for i := range harnesses {
			h := newHarness(t)
			harnesses[i] = h
			h.start(worker.Config{
				Name:     fmt.Sprintf("processor-%d", i),
				Bulkhead: bulkhead,
				Poker:    poker,
				Pacing:   tune.Pacing{IdleInterval: hour},
			}, worker.ActionFunc(func(ctx context.Context) (worker.Directive, error) {
				h.mark()
				n := running.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				time.Sleep(30 * time.Second)
				running.Add(-1)
				return worker.Idle(), nil
			}))
		}
		synctest.Wait()
		if n := bulkhead.InUse(); n != 2 {
			t.Fatalf("bulkhead in use = %d right after start, want 2", n)
		}
		go func() {
			for range 8 {
				poker.Poke()
				time.Sleep(5 * time.Second)
			}
		}()
		time.Sleep(5 * time.Minute)

		var firstStarts []time.Duration
		total := 0
		for _, h := range harnesses {
			calls := h.stop()
			if len(calls) == 0 {
				t.Fatal("a worker never executed")
			}
			total += len(calls)
			firstStarts = append(firstStarts, calls[0])
		}
		if p := peak.Load(); p != 2 {
			t.Fatalf("peak concurrency = %d, want exactly the bulkhead limit 2", p)
		}
		at0, at30 := 0, 0
		for _, s := range firstStarts {
			switch s {
			case 0:
				at0++
			case 30 * time.Second:
				at30++
			}
		}
		if at0 != 2 || at30 != 2 {
			t.Fatalf("first calls started at %v, want two at 0 and two at 30s", firstStarts)
		}
		if total < 5 {
			t.Fatalf("only %d calls in total; pokes should have woken idle workers", total)
		}
	})
}

func TestStopWhileIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: hour}}, scripted(h, step{dir: worker.Idle()}))
		time.Sleep(time.Minute)
		requireStarts(t, h.stop(), 0) // stop() asserts it returns without delay
	})
}

func TestStopDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: hour}, Backoff: worker.BackoffConfig{Base: hour, Max: hour}},
			scripted(h, step{err: errors.New("x")}))
		time.Sleep(time.Minute)
		requireStarts(t, h.stop(), 0)
	})
}

func TestStopDuringProceedPacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.start(worker.Config{Pacing: tune.Pacing{MinInterval: hour, ActiveInterval: hour, IdleInterval: hour}},
			scripted(h, step{dir: worker.Proceed()}))
		time.Sleep(time.Minute)
		requireStarts(t, h.stop(), 0)
	})
}

// An Execute in flight sees the cancelled context; Run returns as soon as it
// does, without reporting the cancellation as a failure.
func TestStopDuringExecute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		var sawCancel atomic.Bool
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: hour}},
			worker.ActionFunc(func(ctx context.Context) (worker.Directive, error) {
				h.mark()
				<-ctx.Done()
				sawCancel.Store(true)
				return worker.Directive{}, ctx.Err()
			}))
		time.Sleep(time.Minute)
		requireStarts(t, h.stop(), 0)
		if !sawCancel.Load() {
			t.Fatal("Execute did not see the cancelled context")
		}
		if f := h.recordedFailures(); len(f) != 0 {
			t.Fatalf("cancellation reported as failure: %+v", f)
		}
	})
}

func TestStopWhileWaitingForBulkhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bulkhead, _ := worker.NewBulkhead(1)
		release, err := bulkhead.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		h := newHarness(t)
		h.start(worker.Config{Bulkhead: bulkhead, Pacing: tune.Pacing{IdleInterval: hour}}, scripted(h, step{dir: worker.Idle()}))
		time.Sleep(time.Minute)
		requireStarts(t, h.stop()) // never executed
	})
}

func TestRunWithCancelledContextDoesNotExecute(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	err := worker.Run(ctx, worker.Config{}, worker.ActionFunc(func(context.Context) (worker.Directive, error) {
		called = true
		return worker.Idle(), nil
	}))
	if err != nil || called {
		t.Fatalf("Run = %v, called = %v; want nil, false", err, called)
	}
}

// A zero Config uses the default pacing (1s safety-net poll) and backoff
// (1s doubling).
func TestZeroConfigUsesDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		if got := tune.Default.Pacing().IdleInterval; got != time.Second {
			t.Fatalf("test assumes a 1s default idle interval, got %v", got)
		}
		h := newHarness(t)
		h.start(worker.Config{}, scripted(h, step{err: errors.New("x")}, step{err: errors.New("x")}, step{dir: worker.Idle()}))
		time.Sleep(4500 * time.Millisecond)
		s := time.Second
		requireStarts(t, h.stop(), 0, 1*s, 3*s, 4*s)
	})
}

func TestRunRejectsInvalidConfig(t *testing.T) {
	idle := worker.ActionFunc(func(context.Context) (worker.Directive, error) { return worker.Idle(), nil })
	tests := []struct {
		name   string
		cfg    worker.Config
		action worker.Action
		field  string
	}{
		{"nil action", worker.Config{}, nil, "action"},
		{"idle interval missing", worker.Config{Pacing: tune.Pacing{ActiveInterval: time.Second}}, idle, "Pacing.IdleInterval"},
		{"active below min", worker.Config{Pacing: tune.Pacing{MinInterval: 2, ActiveInterval: 1, IdleInterval: 3}}, idle, "Pacing.ActiveInterval"},
		{"backoff base missing", worker.Config{Backoff: worker.BackoffConfig{Max: time.Second}}, idle, "Backoff.Base"},
		{"backoff max below base", worker.Config{Backoff: worker.BackoffConfig{Base: time.Second, Max: 1}}, idle, "Backoff.Max"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := worker.Run(context.Background(), tt.cfg, tt.action)
			requireConfigError(t, err, tt.field)
		})
	}
}

func requireConfigError(t *testing.T, err error, field string) {
	t.Helper()
	var ce *tune.ConfigError
	if !errors.Is(err, tune.ErrInvalidConfig) || !errors.As(err, &ce) {
		t.Fatalf("error %v is not a *tune.ConfigError", err)
	}
	if ce.Field != field || ce.Reason == "" {
		t.Fatalf("ConfigError = %+v, want field %q with a reason", ce, field)
	}
}

func TestDirective(t *testing.T) {
	p1, p2, s1, s2 := worker.Proceed(), worker.Proceed(), worker.Sleep(time.Second), worker.Sleep(time.Second)
	if p1 != p2 || s1 != s2 {
		t.Fatal("equal directives must compare equal")
	}
	if worker.Sleep(time.Second) == worker.Sleep(2*time.Second) || worker.Idle() == worker.Proceed() {
		t.Fatal("different directives must differ")
	}
	if (worker.Directive{}) != worker.Idle() {
		t.Fatal("the zero Directive must be Idle")
	}
	if worker.Sleep(-time.Second) != worker.Sleep(0) {
		t.Fatal("a negative sleep must equal Sleep(0)")
	}
	for d, want := range map[worker.Directive]string{
		worker.Proceed(): "proceed", worker.Idle(): "idle", worker.Sleep(1500 * time.Millisecond): "sleep(1.5s)",
	} {
		if got := d.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

// With a poke source, an idle worker's safety-net poll stretches (doubling
// up to 30 s) while its polls find nothing, and comes back to IdleInterval
// once a poll that no poke asked for finds work.
func TestIdlePollStretchesWhilePokesExplainTheWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		h := newHarness(t)
		i, p := worker.Idle(), worker.Proceed()
		steps := make([]step, 14)
		for k := range steps {
			steps[k] = step{dir: i}
		}
		steps = append(steps, step{dir: p}, // found work no poke announced: back to 10 ms
			step{dir: i}, step{dir: i}, step{dir: i})
		h.start(worker.Config{
			Pacing: tune.Pacing{MinInterval: 5 * ms, ActiveInterval: 5 * ms, IdleInterval: 10 * ms},
			Poker:  worker.NewPoker(),
		}, scripted(h, steps...))
		// Waits 10, 20, 40, ..., 20,480 ms, then 30 s twice; after the
		// find, active 5 ms, then 10 and 20 ms again.
		want := startsAfter(10*ms, 20*ms, 40*ms, 80*ms, 160*ms, 320*ms, 640*ms, 1280*ms, 2560*ms, 5120*ms, 10240*ms, 20480*ms,
			30*time.Second, 30*time.Second, 5*ms, 10*ms, 20*ms)
		time.Sleep(want[len(want)-1] + ms)
		requireStarts(t, h.stop(), want...)
	})
}

// Once a poll that no poke asked for found work (a sequencer that does not
// notify), the idle poll stretches only to a second, until a poke
// announces work again; then it stretches to 30 s again.
func TestIdlePollStretchesLessOnceThePokesMissedWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		h := newHarness(t)
		poker := worker.NewPoker()
		i, p := worker.Idle(), worker.Proceed()
		steps := []step{
			{dir: i}, {dir: i}, {dir: i}, {dir: i}, {dir: i}, {dir: i}, {dir: i}, {dir: i}, // 10 ms doubling to 1,280
			{dir: p}, // unannounced work: the pokes missed it
		}
		for range 9 { // 5 ms active, then 10 ms doubling, capped at a second
			steps = append(steps, step{dir: i})
		}
		steps = append(steps, step{dir: p}) // poked: the pokes announce work again
		steps = append(steps, step{dir: i}) // and idle from then on
		h.start(worker.Config{
			Pacing: tune.Pacing{MinInterval: 5 * ms, ActiveInterval: 5 * ms, IdleInterval: 10 * ms},
			Poker:  poker,
		}, scripted(h, steps...))
		missed := startsAfter(10*ms, 20*ms, 40*ms, 80*ms, 160*ms, 320*ms, 640*ms, 1280*ms, // the find at 2,550 ms
			5*ms, 10*ms, 20*ms, 40*ms, 80*ms, 160*ms, 320*ms, 640*ms, time.Second) // capped at 1 s
		last := missed[len(missed)-1]
		time.Sleep(last + 500*ms)
		poker.Poke() // at last+500 ms, in the middle of a 1 s wait
		synctest.Wait()
		poked := last + 500*ms
		// After the poked find: 5 ms active, then the wait goes on doubling
		// from the second it had reached, now up to 30 s.
		after := startsAfter(5*ms, time.Second, 2*time.Second, 4*time.Second, 8*time.Second, 16*time.Second, 30*time.Second, 30*time.Second)
		want := append(missed, poked)
		for _, d := range after[1:] {
			want = append(want, poked+d)
		}
		time.Sleep(want[len(want)-1] - poked + ms)
		requireStarts(t, h.stop(), want...)
	})
}

// startsAfter is when the calls of a worker start that waits each of waits
// in turn after the call before (calls take no time): 0, then the sums.
func startsAfter(waits ...time.Duration) []time.Duration {
	out := []time.Duration{0}
	for _, w := range waits {
		out = append(out, out[len(out)-1]+w)
	}
	return out
}

// Without a poke source nothing would announce work: the idle poll keeps
// its interval.
func TestIdlePollKeepsItsIntervalWithoutAPokeSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		h := newHarness(t)
		i := worker.Idle()
		h.start(worker.Config{Pacing: tune.Pacing{IdleInterval: 10 * ms}},
			scripted(h, step{dir: i}, step{dir: i}, step{dir: i}, step{dir: i}))
		time.Sleep(35 * ms)
		requireStarts(t, h.stop(), 0, 10*ms, 20*ms, 30*ms)
	})
}
