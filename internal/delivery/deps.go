package delivery

import (
	"context"
	"time"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/pgexec"
)

// Lease is what a Worker needs of its partition's lease: the cursor row as
// it was when the lease was acquired, and the cursor writes, each fenced by
// the lease's owner and token. internal/lease.Lease is the implementation.
type Lease interface {
	// Partition is the leased partition.
	Partition() int
	// Context ends when the lease does (lost, released, or the
	// subscription stopped).
	Context() context.Context
	// Owner and Token fence every write to the cursor row.
	Owner() string
	Token() int64

	// The cursor row at acquisition: the last seq done, the head
	// message's charged failed attempts, its last error and what was left
	// of its backoff; the attempts charged by the acquisition for a crash
	// (the last holder died while delivering the head alone); the suspects
	// (the messages in flight when a process died with several deliveries
	// in flight, to be delivered alone; 0, 0 for none) and whether the
	// acquisition found such a crash.
	Cursor() int64
	Attempts() int
	LastError() string
	Backoff() time.Duration
	Charged() int
	Suspects() (from, to int64)
	UnexplainedCrash() bool

	// Advance moves the cursor to seq in q (the caller's transaction, or
	// a single statement); AdvanceRelaxed does the same in a transaction
	// of its own that does not wait for the WAL flush.
	Advance(ctx context.Context, q pgexec.Querier, seq int64) error
	AdvanceRelaxed(ctx context.Context, seq int64) error
	// RecordRetry records a failed attempt of the head and when its retry
	// is due.
	RecordRetry(ctx context.Context, q pgexec.Querier, cause error, retryIn time.Duration) error
	// UndoDelivery takes back a counted delivery that never happened.
	UndoDelivery(ctx context.Context, cursor int64) error
	// Verify explains a fenced write that changed nothing: the lease is
	// gone (lease.ErrLeaseLost) or the cursor moved under it.
	Verify(ctx context.Context, op string, seq int64) error
}

// Policy is the adaptive batching policy of a partition: how many messages
// the next batch takes, how long to back off, and what it learns from each
// outcome. adaptive.Mode is the implementation.
type Policy interface {
	BatchSize() int
	Backoff() time.Duration
	State() adaptive.State
	// Succeeded: the whole batch was done.
	Succeeded()
	// Failed: processed messages were done, then one failed (retry).
	Failed(processed int)
	// Rejected: processed messages were done, then one was rejected or
	// must be isolated (shrink at once, no backoff).
	Rejected(processed int)
}

var (
	_ Lease  = (*lease.Lease)(nil)
	_ Policy = (*adaptive.Mode)(nil)
)
