package consumer

import (
	"time"

	"github.com/millrace/watermill-outbox/internal/consumer/seam"
	"github.com/millrace/watermill-outbox/internal/tune"
)

// A worker sees the rest of the system through three small interfaces: its
// partition's Lease (the cursor row as acquired, and every fenced cursor
// write), the Policy (adaptive batching) and the Store (the log, the
// transactions, the held keys). Lease and Store, and the values that cross
// them, are defined in internal/consumer/seam and aliased here; the
// PostgreSQL implementations are in store_pg.go (with internal/lease), the
// in-memory ones the unit tests use in internal/consumer/consumerfake.
// Transactions travel as pgx.Tx: the handler of the Transactional strategy
// and the RejectHandler get one, and the fakes implement it.

// Lease is what a Worker needs of its partition's lease (seam.Lease).
type Lease = seam.Lease

// Store is the workers' access to the database, apart from the cursor
// writes, which go through their Lease (seam.Store).
type Store = seam.Store

// HeldStore is the store of key isolation's held messages (seam.HeldStore).
type HeldStore = seam.HeldStore

// Entry is one sequenced message read from the log (seam.Entry).
type Entry = seam.Entry

// HeldRow is one held message as the store keeps it (seam.HeldRow).
type HeldRow = seam.HeldRow

// Hold is a message to hold back (seam.Hold).
type Hold = seam.Hold

// SavepointOp is one of the savepoint statements of the Transactional
// strategy (seam.SavepointOp).
type SavepointOp = seam.SavepointOp

// The savepoint statements (seam's).
const (
	SavepointFirst         = seam.SavepointFirst
	SavepointNext          = seam.SavepointNext
	SavepointRelease       = seam.SavepointRelease
	SavepointRollback      = seam.SavepointRollback
	SavepointBatch         = seam.SavepointBatch
	SavepointBatchRelease  = seam.SavepointBatchRelease
	SavepointBatchRollback = seam.SavepointBatchRollback
)

// Policy is the adaptive batching policy of a partition: how many messages
// the next batch takes, how long to back off, and what it learns from each
// outcome. tune.Mode is the implementation.
type Policy interface {
	BatchSize() int
	Backoff() time.Duration
	State() tune.State
	// Succeeded: the whole batch was done.
	Succeeded()
	// Failed: processed messages were done, then one failed (retry).
	Failed(processed int)
	// Rejected: processed messages were done, then one was rejected or
	// must be isolated (shrink at once, no backoff).
	Rejected(processed int)
}

var _ Policy = (*tune.Mode)(nil)
