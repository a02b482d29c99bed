// Package seam is where the consumer core (internal/consumer) meets the
// database: the Lease of a partition (every fenced cursor write), the Store
// (the log, the transactions, the held keys) and the values that cross
// them. internal/consumer aliases every name here; its implementations are
// PostgreSQL's (internal/consumer's store_pg.go with internal/lease), the
// simulator's model (internal/sim) and the in-memory fake the unit tests
// run on (internal/consumer/consumerfake). The names live in a package of
// their own, below internal/consumer, so that the fake can implement them
// without importing the core, and the core's unit tests can import the
// fake.
package seam

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease is what a Worker needs of its partition's lease.
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
	// message's failed attempts, its last error and what was left of its
	// backoff; the attempts charged by the acquisition for a crash (the
	// last holder died while delivering the head alone); the suspects (the
	// messages in flight when a process died with several deliveries in
	// flight, to be delivered alone; 0, 0 for none) and whether the
	// acquisition found such a crash.
	Cursor() int64
	Attempts() int
	LastError() string
	Backoff() time.Duration
	Charged() int
	Suspects() (from, to int64)
	UnexplainedCrash() bool

	// Advance moves the cursor to seq, in tx, or in a statement of its own
	// when tx is nil; AdvanceRelaxed does it in a transaction of its own
	// that does not wait for the WAL flush.
	Advance(ctx context.Context, tx pgx.Tx, seq int64) error
	AdvanceRelaxed(ctx context.Context, seq int64) error
	// RecordRetry records a failed attempt of the head and when its retry
	// is due, in tx or a statement of its own.
	RecordRetry(ctx context.Context, tx pgx.Tx, cause error, retryIn time.Duration) error
	// UndoDelivery takes back the delivery in flight (never handed out, or
	// interrupted by the worker's own stop).
	UndoDelivery(ctx context.Context, cursor int64) error
	// Verify explains a fenced write that changed nothing: the lease is
	// gone (an error matching lease.ErrLeaseLost) or the cursor moved
	// under it.
	Verify(ctx context.Context, op string, seq int64) error
}

// Entry is one sequenced message read from the log.
type Entry struct {
	Seq      int64
	UUID     string
	Key      string
	Metadata map[string]string
	Payload  []byte
	// PayloadMissing: the payload was kept in bodies and its row is gone;
	// the message cannot be delivered as it was written.
	PayloadMissing bool
	// PublishedAt and SequencedAt are when the message was written (its
	// publishing statement) and given its seq; zero when unknown.
	PublishedAt, SequencedAt time.Time
}

// SavepointOp is one of the savepoint statements of the Transactional
// strategy (transaction.sql).
type SavepointOp int

// The savepoint statements.
const (
	SavepointFirst    SavepointOp = iota // before a batch's first message
	SavepointNext                        // release the last message's, set the next's
	SavepointRelease                     // release the last message's
	SavepointRollback                    // undo the last message's writes
	SavepointBatch                       // before a batch handler's batch
	SavepointBatchRelease
	SavepointBatchRollback
)

// HeldRow is one held message as the store keeps it (key isolation).
type HeldRow struct {
	Seq          int64
	Keyless      bool
	Key          string
	Attempts     int
	Deliveries   int
	LastError    string
	FirstFailure *time.Time
	RetryAt      *time.Time
	Requested    string
	Suspect      bool
}

// Hold is a message to hold back, written with the scan move past it.
type Hold struct {
	Seq      int64
	Key      string
	Keyless  bool
	Attempts int
	Err      string // "" for a message parked behind its key's head
	Delay    time.Duration
}

// Store is the workers' access to the database, apart from the cursor
// writes, which go through their Lease.
type Store interface {
	// Read returns up to limit entries of partition after cursor, in seq
	// order. With fence set, the same statement counts a delivery of the
	// head (cursor+1) and records what is in flight (the head, or with
	// wholeBatch every entry returned; solo: the only delivery in flight
	// in the process), fenced by the lease, and returns the count; nil
	// when nothing was counted (no head, or the fence did not hold).
	Read(ctx context.Context, topic string, partition int, cursor int64, limit int, fence Lease, wholeBatch, solo bool) ([]Entry, *int32, error)
	// ReadSeqs returns the entries of the given seqs (held messages).
	ReadSeqs(ctx context.Context, topic string, partition int, seqs []int64) ([]Entry, error)
	// Begin starts the transaction of a Transactional batch.
	Begin(ctx context.Context) (pgx.Tx, error)
	// InTx runs fn in a transaction of its own, committed when fn returns
	// nil; relaxed commits it without waiting for the WAL flush.
	InTx(ctx context.Context, relaxed bool, fn func(pgx.Tx) error) error
	// Savepoint runs one of the savepoint statements in tx.
	Savepoint(ctx context.Context, tx pgx.Tx, op SavepointOp) error
	// SaveAdaptive shows a partition's adaptive state on its cursor row.
	SaveAdaptive(ctx context.Context, topic string, partition int, token int64, state string, size int) error
	// MarkInFlight records seq as l's partition's delivery in flight (a
	// message after a batch's head, in careful mode); ok is false when
	// the fence did not hold.
	MarkInFlight(ctx context.Context, topic string, l Lease, seq int64) (ok bool, err error)

	HeldStore
}

// HeldStore is the store of key isolation's held messages; every write is
// fenced by the lease on the partition's cursor row.
type HeldStore interface {
	// HeldAdopt settles the held retries a dead holder left in flight.
	HeldAdopt(ctx context.Context, topic string, l Lease) error
	// HeldLoad reads the partition's held messages in seq order.
	HeldLoad(ctx context.Context, topic string, partition int) ([]HeldRow, error)
	// HeldInsert holds messages back, in tx.
	HeldInsert(ctx context.Context, tx pgx.Tx, topic string, partition int, rows []Hold) error
	// HeldCount counts a retry of seq before it is handed out and records
	// it in flight; ok is false when the lease or the row is gone.
	HeldCount(ctx context.Context, topic string, l Lease, seq int64, solo bool) (deliveries int, ok bool, err error)
	// HeldUndoCount takes back a retry that was never handed out.
	HeldUndoCount(ctx context.Context, topic string, l Lease, seq int64) error
	// HeldRetry records a failed retry of seq and when the next is due;
	// ok is false when the lease or the row is gone.
	HeldRetry(ctx context.Context, topic string, l Lease, seq int64, text string, delay time.Duration) (ok bool, err error)
	// HeldRelease finishes held messages (acked or dead-lettered), in tx
	// or a statement of its own; it returns how many it released.
	HeldRelease(ctx context.Context, tx pgx.Tx, topic string, l Lease, seqs []int64) (int, error)
	// HeldShowFull shows (or clears) that the partition blocks because
	// its isolation bounds are reached.
	HeldShowFull(ctx context.Context, topic string, l Lease, full bool) error
}
