package consumer

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/worker"
)

// Subscription is a consumer group's delivery of one topic in this process:
// the partitions the lease manager gives it, a Worker for each. A Subscriber
// runs it (Run: a goroutine per partition); package outboxtest steps it in
// the caller's goroutine (Step). Either way the same Workers deliver.
type Subscription struct {
	cfg         *Config
	manager     *lease.Manager
	topic       string
	incarnation string
	out         chan<- *message.Message
	batch       BatchHandler

	// Step's workers, by partition (Run keeps its own).
	stepped map[int]*stepped
}

// stepped is a partition Step delivers.
type stepped struct {
	lease   *lease.Lease
	worker  *Worker
	retryAt time.Time // a backoff the worker asked for ends then: no turn before
}

// NewSubscription returns the subscription of topic (whose incarnation is
// MetadataIncarnation) for the group of cfg, on the partitions manager
// leases: its messages go to out one at a time, or to batch.
func NewSubscription(cfg *Config, manager *lease.Manager, topic, incarnation string, out chan<- *message.Message, batch BatchHandler) *Subscription {
	return &Subscription{cfg: cfg, manager: manager, topic: topic, incarnation: incarnation, out: out, batch: batch, stepped: map[int]*stepped{}}
}

// Topic is the subscription's topic.
func (s *Subscription) Topic() string { return s.topic }

// MemberID is the id it leases under.
func (s *Subscription) MemberID() string { return s.manager.MemberID() }

// Counts are the running totals of the group's deliveries (shared by its
// subscriptions).
func (s *Subscription) Counts() *Counts { return s.cfg.Counts }

// newWorker is the worker of a partition l leases.
func (s *Subscription) newWorker(l *lease.Lease) *Worker {
	return NewWorker(s.cfg, s.topic, s.incarnation, PGLease{Lease: l}, s.out, s.batch)
}

// Run takes the subscription's share of the partitions and delivers each on
// a goroutine of its own until ctx ends; then it waits for its workers. A
// lease manager that cannot start (the database is unreachable, say) is
// started again with the shared backoff, each failure reported to
// onError.
func (s *Subscription) Run(ctx context.Context, onError func(err error, attempt int, wait time.Duration)) {
	var workers sync.WaitGroup
	onAcquire := func(l *lease.Lease) {
		w := s.newWorker(l)
		workers.Add(1)
		go func() {
			defer workers.Done()
			defer l.Done()
			w.Run()
		}()
	}
	_ = backoff.Retry(ctx, backoff.Default, func(ctx context.Context) error {
		return s.manager.Run(ctx, onAcquire)
	}, onError)
	workers.Wait()
}

// StepResult is what one Step did.
type StepResult struct {
	// Partitions is how many partitions the subscription holds.
	Partitions int
	// RetryIn is the soonest a partition backing off (or holding a key
	// whose retry is due later) wants its next turn; 0 for none.
	RetryIn time.Duration
}

// Step takes the partitions the group leaves to this subscription and runs
// one turn of each, in partition order, with turn (which runs w.Step, and
// serves its hand-outs when the caller is their handler). A partition
// backing off gets no turn until its backoff ends, as under Run. An error
// joins the turns' errors other than a lost lease (that partition is
// dropped at the next Step).
func (s *Subscription) Step(ctx context.Context, turn func(w *Worker) (worker.Directive, error)) (StepResult, error) {
	return s.step(ctx, turn, false)
}

// StepConcurrently is Step with the turns run at once, each on a goroutine
// of its own, as the Workers of Run run: their calls into the target
// overlap (the deterministic simulator steps instances this way). The
// turns' outcomes are taken in partition order once all have returned.
func (s *Subscription) StepConcurrently(ctx context.Context, turn func(w *Worker) (worker.Directive, error)) (StepResult, error) {
	return s.step(ctx, turn, true)
}

func (s *Subscription) step(ctx context.Context, turn func(w *Worker) (worker.Directive, error), concurrently bool) (StepResult, error) {
	var res StepResult
	acquired, err := s.manager.Step(ctx)
	if err != nil {
		return res, err
	}
	for _, l := range acquired {
		s.stepped[l.Partition()] = &stepped{lease: l, worker: s.newWorker(l)}
	}
	// In partition order: a run of Step does the same calls in the same
	// order each time (the simulator replays a seed call for call).
	parts := make([]int, 0, len(s.stepped))
	for _, p := range s.partitions() {
		st := s.stepped[p]
		if st.lease.Context().Err() != nil { // lost (expired, paused, rebalanced)
			st.worker.Stop()
			st.lease.Done()
			delete(s.stepped, p)
			continue
		}
		parts = append(parts, p)
	}
	res.Partitions = len(parts)
	retryIn := func(d time.Duration) {
		if d > 0 && (res.RetryIn == 0 || d < res.RetryIn) {
			res.RetryIn = d
		}
	}
	var errs []error
	type outcome struct {
		ran bool
		dir worker.Directive
		err error
	}
	outcomes := make([]outcome, len(parts))
	done := make(chan struct{}, len(parts))
	started := 0
	for i, p := range parts {
		st := s.stepped[p]
		if wait := time.Until(st.retryAt); wait > 0 {
			retryIn(wait) // still backing off: no turn
			continue
		}
		if !concurrently {
			dir, err := turn(st.worker)
			outcomes[i] = outcome{true, dir, err}
			continue
		}
		started++
		go func() {
			dir, err := turn(st.worker)
			outcomes[i] = outcome{true, dir, err}
			done <- struct{}{}
		}()
	}
	for range started {
		<-done
	}
	for i, p := range parts {
		st := s.stepped[p]
		if !outcomes[i].ran {
			continue
		}
		dir, err := outcomes[i].dir, outcomes[i].err
		if err != nil {
			if !errors.Is(err, lease.ErrLeaseLost) {
				errs = append(errs, fmt.Errorf("partition %d: %w", p, err))
			}
			continue
		}
		// A backoff (Sleep): no turn before it ends. A held key's retry
		// due later (IdleFor): the worker itself holds the key back.
		if d, sleeping := dir.SleepDelay(); sleeping && d > 0 {
			st.retryAt = time.Now().Add(d)
		}
		retryIn(dir.Delay())
	}
	return res, errors.Join(errs...)
}

// partitions returns the partitions Step holds, in order.
func (s *Subscription) partitions() []int {
	parts := make([]int, 0, len(s.stepped))
	for p := range s.stepped {
		parts = append(parts, p)
	}
	sort.Ints(parts)
	return parts
}

// Close ends what Step started: the workers stop (taking back a delivery
// left in flight) and the leases are given back, so that another member of
// the group takes them at once.
func (s *Subscription) Close(ctx context.Context) {
	for _, p := range s.partitions() {
		st := s.stepped[p]
		st.worker.Stop()
		st.lease.Done()
		delete(s.stepped, p)
	}
	s.manager.Stop(ctx)
}
