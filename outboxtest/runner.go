package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/runnerhook"
	"github.com/millrace/watermill-outbox/internal/worker"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Handler handles one message, as a Watermill Router's handler does: nil
// acks it, an error nacks it (it is retried after the Subscriber's backoff,
// and reaches the RejectHandler after MaxAttempts), and an error from
// outbox.Reject takes it out of the stream at once.
type Handler func(msg *message.Message) error

// State is what one Tick found.
type State string

// The states of a Tick.
const (
	// Processed: messages were handed to the handler.
	Processed State = "processed"
	// Idle: nothing to deliver.
	Idle State = "idle"
	// BackingOff: a partition waits out a retry backoff after a failure
	// (TickResult.RetryIn), and nothing else was delivered.
	BackingOff State = "backing off"
	// Paused: the runner holds no partition and some are paused
	// (admin.Pause, outbox pause).
	Paused State = "paused"
	// LeasedByAnother: the runner holds no partition because another
	// member of the group (a running Subscriber) holds them.
	LeasedByAnother State = "leased by another"
)

// TickResult says what one Tick did.
type TickResult struct {
	State State
	// Sequenced is how many committed messages the sequencer numbered
	// first (0 with DisableSequencer).
	Sequenced int
	// Acked, Failed and Rejected count this tick's deliveries: handled,
	// failed (to be retried), taken out of the stream.
	Acked, Failed, Rejected int
	// Partitions is how many partitions the runner holds.
	Partitions int
	// RetryIn is, when backing off, the soonest a partition retries.
	RetryIn time.Duration
	// HandlerErr is the error of this tick's last failed or rejected
	// delivery (the handler's own error, or the panic it raised), nil when
	// every delivery was acked.
	HandlerErr error
}

// Result sums the ticks of RunUntilIdle.
type Result struct {
	Ticks                   int
	Sequenced               int
	Acked, Failed, Rejected int
	// Last is the state RunUntilIdle stopped in: Idle, BackingOff (a
	// message keeps failing; call again after RetryIn, or let MaxAttempts
	// take it out), Paused or LeasedByAnother.
	Last    State
	RetryIn time.Duration
	// HandlerErr is the error of the last failed or rejected delivery of
	// any tick (the handler's own error, or the panic it raised): what a
	// Result of Failed: 1, Last: BackingOff failed with. Nil when none
	// failed.
	HandlerErr error
}

// add counts one tick into r: its sums, and its state and handler error as
// the last ones.
func (r *Result) add(t TickResult) {
	r.Ticks++
	r.Sequenced += t.Sequenced
	r.Acked += t.Acked
	r.Failed += t.Failed
	r.Rejected += t.Rejected
	r.Last, r.RetryIn = t.State, t.RetryIn
	if t.HandlerErr != nil {
		r.HandlerErr = t.HandlerErr
	}
}

// Handled is how many deliveries ended in an outcome: acked, failed or
// rejected.
func (r Result) Handled() int { return r.Acked + r.Failed + r.Rejected }

// Runner delivers one topic to a handler for a consumer group in the
// calling goroutine, with the Subscriber's own machinery: the sequencer
// numbers what was committed, the partitions are leased as a Subscriber
// leases them (so a running Subscriber of the same group keeps its own),
// and each leased partition's worker reads, hands out, acks or retries and
// moves its cursor exactly as in production, with the strategy,
// MaxAttempts, RejectHandler, KeyIsolation and Tuning of the config. Only
// the waiting between turns is left out: a Tick is one turn of every
// partition, run now.
//
// A Runner is for one goroutine. Close it (or let RunUntilIdle's
// convenience function do it).
type Runner struct {
	sub       *outbox.Subscriber
	sc        *consumer.Subscription
	sequencer *outbox.Sequencer // nil with DisableSequencer
	pool      tickStater
	schema    string
	group     string
	handler   Handler
	batch     outbox.BatchHandler
	out       chan *message.Message
	calls     chan batchCall
	closed    bool
	// panicked is a panic of the handler, re-raised by the Tick that
	// met it once the partition's turn is over.
	panicked any
	// handlerErr is the last error a handler returned in this Tick.
	handlerErr error
	// ahead is how far Advance moved the runner's clock past the real one.
	ahead atomic.Int64
}

// tickStater runs the query that says why a runner holds no partition.
type tickStater interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type batchCall struct {
	ctx   context.Context
	msgs  []*message.Message
	reply chan batchReply
}

type batchReply struct {
	done int
	err  error
}

// NewRunner creates a Runner delivering topic one message at a time to h,
// as Subscribe and a Router would. cfg is the consumer's SubscriberConfig
// (Pool, Schema, ConsumerGroup, Strategy, ...); its sequencer runs at the
// start of every Tick unless DisableSequencer.
func NewRunner(ctx context.Context, cfg outbox.SubscriberConfig, topic string, h Handler) (*Runner, error) {
	if h == nil {
		return nil, &outboxtype.ConfigError{Field: "h", Reason: "a Handler is required"}
	}
	return newRunner(ctx, cfg, topic, h, nil)
}

// NewBatchRunner creates a Runner delivering topic in batches to h, as
// ConsumeBatches would (a forwarder's handler: forwarder.Forwarder.Consumer).
func NewBatchRunner(ctx context.Context, cfg outbox.SubscriberConfig, topic string, h outbox.BatchHandler) (*Runner, error) {
	if h == nil {
		return nil, &outboxtype.ConfigError{Field: "h", Reason: "a BatchHandler is required"}
	}
	return newRunner(ctx, cfg, topic, nil, h)
}

func newRunner(ctx context.Context, cfg outbox.SubscriberConfig, topic string, h Handler, batch outbox.BatchHandler) (*Runner, error) {
	sub, err := outbox.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	r := &Runner{
		sub: sub, pool: cfg.Pool, schema: cfg.Schema, group: cfg.ConsumerGroup, handler: h, batch: batch,
		out:   make(chan *message.Message),
		calls: make(chan batchCall),
	}
	if r.schema == "" {
		r.schema = outbox.DefaultSchema
	}
	var forward consumer.BatchHandler
	if batch != nil {
		forward = r.forwardBatch
	}
	if r.sc, err = runnerhook.Subscription(sub, ctx, topic, r.out, forward); err != nil {
		_ = sub.Close()
		return nil, err
	}
	if !cfg.DisableSequencer {
		if r.sequencer, err = outbox.NewSequencer(outbox.SequencerConfig{Schema: r.schema, Pool: cfg.Pool, Clock: r.now}, nil); err != nil {
			_ = sub.Close()
			return nil, err
		}
	}
	return r, nil
}

// now is the runner's clock: the real one, moved on by Advance.
func (r *Runner) now() time.Time { return time.Now().Add(time.Duration(r.ahead.Load())) }

// Advance moves the runner's clock on by d, for delayed messages
// (outbox.DeliverAt): its sequencer takes a message due within d from now
// as due, so that a test of a delayed message does not wait for it. The
// clock only moves forward (d ≤ 0 does nothing); it is the runner's alone.
func (r *Runner) Advance(d time.Duration) {
	if r == nil || d <= 0 {
		return
	}
	r.ahead.Add(int64(d))
}

// errClosed reports a Tick on a closed Runner; it matches outbox.ErrClosed.
var errClosed = fmt.Errorf("%w: the outboxtest Runner was closed: create a new one", outbox.ErrClosed)

// Tick runs the sequencer once (unless disabled), takes the partitions the
// group leaves to this runner, and runs one turn of each in partition
// order, the handler called in this goroutine. It reports what happened.
// An error is a database error (or the lease lost): what a Subscriber would
// log and retry.
func (r *Runner) Tick(ctx context.Context) (TickResult, error) {
	var res TickResult
	if r.sc == nil {
		return res, errs.NotConstructed("outboxtest.Runner", "outboxtest.NewRunner")
	}
	if r.closed {
		return res, errClosed
	}
	if r.sequencer != nil {
		n, err := r.sequencer.SequenceAll(ctx)
		if err != nil {
			return res, fmt.Errorf("outboxtest: sequence: %w", err)
		}
		res.Sequenced = n
	}
	r.handlerErr = nil
	counts := r.sc.Counts()
	acked0, nacked0, rejected0, timedOut0 := counts.Acked.Load(), counts.Nacked.Load(), counts.Rejected.Load(), counts.TimedOut.Load()
	step, err := r.sc.Step(ctx, func(w *consumer.Worker) (worker.Directive, error) {
		dir, err := r.turn(ctx, w)
		if r.panicked != nil {
			v := r.panicked
			r.panicked = nil
			panic(v)
		}
		return dir, err
	})
	if step.Partitions == 0 && err != nil {
		return res, err
	}
	res.Partitions, res.RetryIn, res.HandlerErr = step.Partitions, step.RetryIn, r.handlerErr
	res.Acked = int(counts.Acked.Load() - acked0)
	res.Failed = int(counts.Nacked.Load() - nacked0 + counts.TimedOut.Load() - timedOut0)
	res.Rejected = int(counts.Rejected.Load() - rejected0)
	switch {
	case res.Acked+res.Failed+res.Rejected > 0:
		res.State = Processed
	case res.RetryIn > 0:
		res.State = BackingOff
	case res.Partitions == 0:
		var paused, others int32
		if qerr := r.pool.QueryRow(ctx, dbsql.For(r.schema).CursorsTickState, r.group, r.sc.Topic(), r.sc.MemberID()).Scan(&paused, &others); qerr != nil {
			return res, qerr
		}
		switch {
		case others > 0:
			res.State = LeasedByAnother
		case paused > 0:
			res.State = Paused
		default:
			res.State = Idle
		}
	default:
		res.State = Idle
	}
	return res, err
}

// turn runs one turn of w while serving its hand-outs here: a message from
// out goes to the handler and is acked or nacked; a batch goes to the batch
// handler and its answer back.
func (r *Runner) turn(ctx context.Context, w *consumer.Worker) (worker.Directive, error) {
	type stepped struct {
		dir worker.Directive
		err error
	}
	done := make(chan stepped, 1)
	go func() {
		d, err := w.Step(ctx)
		done <- stepped{d, err}
	}()
	for {
		select {
		case s := <-done:
			return s.dir, s.err
		case m := <-r.out:
			if err := r.call(func() error { return r.handler(m) }); err != nil {
				m.Nack()
			} else {
				m.Ack()
			}
		case c := <-r.calls:
			var n int
			err := r.call(func() error {
				var err error
				n, err = r.batch(c.ctx, c.msgs)
				return err
			})
			c.reply <- batchReply{n, err}
		}
	}
}

// call runs a handler, turning a panic into an error for the worker (so
// that its turn ends) and keeping it to raise after the turn.
func (r *Runner) call(fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			r.panicked = v
			err = fmt.Errorf("outboxtest: handler panicked: %v", v)
		}
		if err != nil {
			r.handlerErr = err
		}
	}()
	return fn()
}

// forwardBatch is the worker's BatchHandler: it hands the batch to the
// goroutine running Tick and waits for its answer.
func (r *Runner) forwardBatch(ctx context.Context, msgs []*message.Message) (int, error) {
	reply := make(chan batchReply, 1)
	select {
	case r.calls <- batchCall{ctx: ctx, msgs: msgs, reply: reply}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case a := <-reply:
		return a.done, a.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// RunUntilIdle ticks until a tick delivers nothing and finds nothing to
// sequence, and returns the sums. It stops, without waiting, when every
// partition is idle or backing off (Result.Last says which), or when the
// runner holds no partition (Paused, LeasedByAnother).
func (r *Runner) RunUntilIdle(ctx context.Context) (Result, error) {
	var sum Result
	for {
		t, err := r.Tick(ctx)
		sum.add(t)
		if err != nil {
			return sum, err
		}
		if t.State != Processed && t.Sequenced == 0 {
			return sum, nil
		}
		if err := ctx.Err(); err != nil {
			return sum, err
		}
	}
}

// Close gives the partitions back (releasing the leases, so that a
// Subscriber of the group takes them at once) and closes the Subscriber it
// was built on. No goroutine of the Runner is left.
func (r *Runner) Close() error {
	if r.closed || r.sc == nil {
		return nil
	}
	r.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.sc.Close(ctx)
	return r.sub.Close()
}

// RunUntilIdle delivers everything committed on topic to h for cfg's
// consumer group, in the calling goroutine, and returns when nothing is
// left (see Runner.RunUntilIdle); the partitions are given back before it
// returns.
func RunUntilIdle(ctx context.Context, cfg outbox.SubscriberConfig, topic string, h Handler) (Result, error) {
	r, err := NewRunner(ctx, cfg, topic, h)
	if err != nil {
		return Result{}, err
	}
	res, err := r.RunUntilIdle(ctx)
	return res, errors.Join(err, r.Close())
}

// RunTopicsUntilIdle delivers everything committed on several topics, each
// to its handler, for cfg's consumer group, in the calling goroutine: it
// ticks every topic's runner in turn (topics in name order) until a round
// in which none delivered anything and the sequencer found nothing, so that
// a handler of one topic that publishes to another (an order that becomes
// a shipment) is followed to the end in one call. It returns each topic's
// sums; the partitions are given back before it returns. No topics, or a
// nil handler, is an error (outbox.ErrInvalidArgument), and nothing runs.
func RunTopicsUntilIdle(ctx context.Context, cfg outbox.SubscriberConfig, handlers map[string]Handler) (map[string]Result, error) {
	if len(handlers) == 0 {
		return nil, fmt.Errorf("%w: outboxtest.RunTopicsUntilIdle: no topics: give a handler per topic to run", outbox.ErrInvalidArgument)
	}
	topics := slices.Sorted(maps.Keys(handlers))
	for _, topic := range topics {
		if handlers[topic] == nil {
			return nil, fmt.Errorf("%w: outboxtest.RunTopicsUntilIdle: the handler of topic %q is nil", outbox.ErrInvalidArgument, topic)
		}
	}
	runners := make([]*Runner, 0, len(topics))
	closeAll := func() error {
		var errs []error
		for _, r := range runners {
			errs = append(errs, r.Close())
		}
		return errors.Join(errs...)
	}
	for _, topic := range topics {
		r, err := NewRunner(ctx, cfg, topic, handlers[topic])
		if err != nil {
			return nil, errors.Join(err, closeAll())
		}
		runners = append(runners, r)
	}
	sums := make(map[string]Result, len(topics))
	for {
		busy := false
		for i, r := range runners {
			t, err := r.Tick(ctx)
			sum := sums[topics[i]]
			sum.add(t)
			sums[topics[i]] = sum
			if err != nil {
				return sums, errors.Join(err, closeAll())
			}
			if t.State == Processed || t.Sequenced > 0 {
				busy = true
			}
		}
		if !busy {
			return sums, closeAll()
		}
		if err := ctx.Err(); err != nil {
			return sums, errors.Join(err, closeAll())
		}
	}
}
