package consumer

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/internal/worker"
)

// Config is what the partition workers of one subscription share: the
// Subscriber's settings and the machinery it owns.
type Config struct {
	Group             string
	Transactional     bool // the Transactional strategy: handlers run in the batch's transaction
	MaxAttempts       int
	HandlerTimeout    time.Duration
	CloseTimeout      time.Duration
	SyncCursorCommits bool
	Tuning            tune.Settings // the resolved tuning (batch sizing, backoff, pacing)
	RejectHandler     RejectHandler // nil: rejected messages are retried
	Isolation         Isolation     // key-level isolation (off when not Enabled)

	Store Store // the log, transactions, held keys, adaptive state
	// Careful is the Subscriber's careful mode (see Careful); nil: never
	// careful.
	Careful  *Careful
	Bulkhead *worker.Bulkhead
	Logger   watermill.LoggerAdapter

	// Register makes p, a worker's poker, reachable by the notifications
	// for its partition; the function it returns undoes that. Nil: no
	// notifications.
	Register func(topic string, partition int, p *worker.Poker) (unregister func())
	// Tasks runs what a worker leaves behind a turn (the waits for the
	// handlers it abandoned); the Subscriber starts them before its
	// workers and stops them, waiting, when it closes. Nil: see Tasks.Go.
	Tasks *Tasks
	// Counts are the Subscriber's running totals (Subscriber.Stats).
	Counts *Counts

	// Jitter spreads a backoff (nil: backoff.Jitter, a random half to
	// the whole of it); the simulator draws it from its seed.
	Jitter func(time.Duration) time.Duration
	// Gate is the delivery gate of the process the workers run in; nil:
	// this process's (the gate is per process: a crash takes every
	// Subscriber and Forwarder of the process down at once). The
	// simulator gives each simulated process its own.
	Gate *Gate
}

// Counts are running totals of a Subscriber's deliveries.
type Counts struct {
	Acked, Nacked, Rejected, TimedOut, Crashed, Batches atomic.Int64
}

// BatchHandler is the handler of ConsumeBatches (outbox.BatchHandler).
type BatchHandler = func(ctx context.Context, batch []*message.Message) (done int, err error)

// abandonAfter is how long a worker waits for a handler's answer:
// HandlerTimeout, when the handler's context ends, plus a tenth of it (at
// most a second), so that a handler that honours its context can still
// answer with its own error. A Worker takes it once (Worker.abandonAfter).
func (s *Config) abandonAfter() time.Duration {
	return s.HandlerTimeout + min(s.HandlerTimeout/10, time.Second)
}
