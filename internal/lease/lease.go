package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/pgtext"
)

// ErrLeaseLost reports that a fenced write found the lease no longer ours:
// another member acquired it, it expired, or it was released.
var ErrLeaseLost = errors.New("lease: lease lost")

// ErrSeqNotAhead reports an Advance to a seq at or behind the cursor while
// the lease is still valid; the cursor is unchanged and the lease kept.
var ErrSeqNotAhead = errors.New("lease: seq is not ahead of the cursor")

// Causes of a lease context's end other than ErrLeaseLost, reported by
// context.Cause.
var (
	errRebalanced = errors.New("lease: released to rebalance the group")
	errPaused     = errors.New("lease: released because the partition was paused")
	errStopped    = errors.New("lease: manager stopped")
	errWorkerDone = errors.New("lease: released because its worker called Done")
)

// maxErrorLen bounds the last_error text RecordFailure stores.
const maxErrorLen = 4096

type leaseState int

const (
	stateActive    leaseState = iota // held, worker running
	stateDraining                    // held and renewed, context cancelled, waiting for Done before release
	stateLost                        // no longer ours, waiting for Done
	stateReleasing                   // Done called, release in the database under way
)

// Lease is this member's lease on one partition, handed to the callback of
// Manager.Run. It is safe for concurrent use.
type Lease struct {
	m         *Manager
	partition int
	token     int64
	cursor    int64
	attempts  int

	// What the acquisition found: the attempts it charged for a crash, the
	// suspects and whether it found a crash nobody could be charged for
	// (see CursorsAcquire), the last error, and the backoff left.
	charged     int
	suspectFrom int64
	suspectTo   int64
	unexplained bool
	lastError   string
	backoff     time.Duration

	ctx      context.Context
	cancel   context.CancelCauseFunc
	done     chan struct{}
	doneOnce sync.Once

	// Guarded by m.mu.
	state      leaseState
	validUntil time.Time // local clock: when the last renewal was sent, plus TTL
}

// Partition is the leased partition.
func (l *Lease) Partition() int { return l.partition }

// Token is the fencing token: the lease's epoch, larger than that of every
// earlier lease on the partition.
func (l *Lease) Token() int64 { return l.token }

// Cursor is the group's cursor in the partition when the lease was
// acquired: the seq of the last message finished, 0 for none.
func (l *Lease) Cursor() int64 { return l.cursor }

// Attempts is the failure count recorded for the partition when the lease
// was acquired (see RecordFailure); Advance resets it.
func (l *Lease) Attempts() int { return l.attempts }

// Charged is how many failed attempts the acquisition charged to the
// partition's next message for a crash: the last holder died (was killed,
// or froze past its lease) while that message was the only delivery in
// flight in its process. They are included in Attempts.
func (l *Lease) Charged() int { return l.charged }

// Suspects are the messages (from, to; 0, 0 for none) after the cursor that
// were in flight when a consumer process died with other deliveries in
// flight: nobody was charged, and each is to be delivered alone until it
// has an outcome, so that the one that crashes a process is found.
func (l *Lease) Suspects() (from, to int64) { return l.suspectFrom, l.suspectTo }

// UnexplainedCrash reports whether the acquisition found a delivery left
// in flight by a holder that died with other deliveries in flight.
func (l *Lease) UnexplainedCrash() bool { return l.unexplained }

// LastError is the last error recorded for the partition's next message
// when the lease was acquired ("" for none).
func (l *Lease) LastError() string { return l.lastError }

// Backoff is how much was left, when the lease was acquired, of the backoff
// the previous holder recorded with RecordRetry: the worker should wait
// that long before retrying the next message.
func (l *Lease) Backoff() time.Duration { return l.backoff }

// Owner is the member id the lease is held under (Config.MemberID).
func (l *Lease) Owner() string { return l.m.cfg.MemberID }

// Context is cancelled when the lease is lost, released (rebalance, pause)
// or the manager stops; context.Cause tells which, and is ErrLeaseLost for
// a lost lease. The worker must then stop and call Done.
func (l *Lease) Context() context.Context { return l.ctx }

// Done tells the manager that the worker using this lease has stopped, so
// that the lease can be released. Safe to call more than once.
func (l *Lease) Done() {
	l.doneOnce.Do(func() {
		close(l.done)
		l.m.poke()
	})
}

func (l *Lease) isDone() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// Advance moves the group's cursor in the partition to seq, the last message
// finished. The UPDATE is fenced: it applies only while this lease is the
// partition's current one (owner and token) and unexpired on the server's
// clock, and only if seq is ahead of the cursor. It also clears the failure
// count, the last error and the delivery in flight.
//
// tx is where the statement runs: the caller's open transaction, so that
// the cursor moves if and only if the transaction commits, or nil for a
// statement of its own. The row stays locked until that transaction ends,
// which also keeps other members from acquiring the partition meanwhile.
//
// When the lease is no longer ours, Advance returns an error matching
// ErrLeaseLost and cancels the lease's context; for a seq that is not ahead
// of the cursor it returns ErrSeqNotAhead.
func (l *Lease) Advance(ctx context.Context, tx pgx.Tx, seq int64) error {
	return l.advance(ctx, tx, false, seq)
}

func (l *Lease) advance(ctx context.Context, tx pgx.Tx, relaxed bool, seq int64) error {
	ok, err := l.m.store.Advance(ctx, tx, relaxed, l.fence(), seq)
	switch {
	case err != nil:
		return fmt.Errorf("lease: advance partition %d to %d: %w", l.partition, seq, err)
	case !ok:
		if relaxed {
			tx = nil
		}
		return l.diagnose(ctx, tx, "advance", seq)
	}
	return nil
}

// fence is what the lease's writes are conditioned on.
func (l *Lease) fence() Fence {
	return Fence{Group: l.m.group, Partition: l.partition, Member: l.m.cfg.MemberID, Token: l.token}
}

// AdvanceRelaxed is Advance in a transaction of its own that commits with
// synchronous_commit off: it does not wait for the server to flush its
// WAL, so it is much cheaper for a stream of small batches, but if the
// PostgreSQL server crashes, cursor moves of the last few hundred
// milliseconds before the crash (up to three times the server's
// wal_writer_delay) can be lost, and their messages are then delivered
// again. Use it where delivery is at least once anyway; the fencing is as
// for Advance.
func (l *Lease) AdvanceRelaxed(ctx context.Context, seq int64) error {
	return l.advance(ctx, nil, true, seq)
}

// RecordFailure counts a failed attempt at the partition's next message and
// stores cause as its last error, fenced like Advance. tx is as for
// Advance. The retry is due at once (see RecordRetry for a backoff).
func (l *Lease) RecordFailure(ctx context.Context, tx pgx.Tx, cause error) error {
	return l.RecordRetry(ctx, tx, cause, 0)
}

// RecordRetry is RecordFailure that also stores when the retry is due
// (backoff_until = now + retryIn on the server's clock), so that a restart
// or the next holder of the lease keeps the backoff (see Backoff).
func (l *Lease) RecordRetry(ctx context.Context, tx pgx.Tx, cause error, retryIn time.Duration) error {
	ok, err := l.m.store.Retry(ctx, tx, l.fence(), errorText(cause), retryIn)
	if err != nil {
		return fmt.Errorf("lease: record failure on partition %d: %w", l.partition, err)
	}
	if ok {
		return nil
	}
	return l.diagnose(ctx, tx, "record failure", -1)
}

// UndoDelivery takes back one delivery of the message after cursor counted
// in cursors.deliveries (by the Subscriber's read) whose message was never
// handed out, e.g. because the lease ended first. Fenced like Advance; a
// cursor that moved meanwhile makes it a no-op.
func (l *Lease) UndoDelivery(ctx context.Context, cursor int64) error {
	if err := l.m.store.UndoDelivery(ctx, l.fence(), cursor); err != nil {
		return fmt.Errorf("lease: undo delivery on partition %d: %w", l.partition, err)
	}
	return nil
}

// Verify explains a fenced write of the caller's own that changed nothing
// (see Advance): an error matching ErrLeaseLost, with the lease's context
// cancelled, when the lease is no longer ours, or an error saying the
// cursor is not at seq.
func (l *Lease) Verify(ctx context.Context, op string, seq int64) error {
	err := l.diagnose(ctx, nil, op, seq)
	if errors.Is(err, ErrSeqNotAhead) {
		return fmt.Errorf("lease: %s on partition %d: the cursor is not at %d: %w", op, l.partition, seq, err)
	}
	return err
}

// diagnose explains why a fenced write changed nothing. seq < 0: no cursor
// condition was involved.
func (l *Lease) diagnose(ctx context.Context, tx pgx.Tx, op string, seq int64) error {
	in, found, err := l.m.store.Inspect(ctx, tx, l.m.group, l.partition)
	var lost error
	switch {
	case err != nil:
		return fmt.Errorf("lease: %s on partition %d changed nothing; inspecting the lease failed: %w", op, l.partition, err)
	case !found:
		lost = fmt.Errorf("%w: %s on partition %d: the cursor row is gone", ErrLeaseLost, op, l.partition)
	case in.Owner == l.m.cfg.MemberID && in.Token == l.token && in.Live:
		if seq >= 0 {
			return fmt.Errorf("%w: partition %d: seq %d, cursor %d", ErrSeqNotAhead, l.partition, seq, in.Cursor)
		}
		return fmt.Errorf("lease: %s on partition %d changed nothing although the lease is valid", op, l.partition)
	case in.Owner == "":
		lost = fmt.Errorf("%w: %s on partition %d (token %d): the lease was released", ErrLeaseLost, op, l.partition, l.token)
	case in.Owner != l.m.cfg.MemberID || in.Token != l.token:
		lost = fmt.Errorf("%w: %s on partition %d (token %d): now held by %q with token %d", ErrLeaseLost, op, l.partition, l.token, in.Owner, in.Token)
	default:
		lost = fmt.Errorf("%w: %s on partition %d (token %d): the lease expired", ErrLeaseLost, op, l.partition, l.token)
	}
	l.m.markLost(l, lost)
	return lost
}

// errorText makes cause storable as PostgreSQL text: valid UTF-8, no NUL,
// at most maxErrorLen bytes.
func errorText(cause error) string {
	if cause == nil {
		return "unknown error"
	}
	return pgtext.Clean(cause.Error(), maxErrorLen)
}

// Writer returns the transactional id recorded as the last writer of the
// partition into a forwarder's target ("" nobody yet; known false: the
// cursor row predates writer records, and an older forwarder may have
// written it under its own scheme). It is a fenced read: when the lease is
// no longer this one, it returns an error matching ErrLeaseLost and
// cancels the lease's context. A forwarder's exactly-once target reads it
// at a takeover, fences that writer, then records itself with SetWriter
// (forwarder/kafka, exactly_once.go).
func (l *Lease) Writer(ctx context.Context) (writer string, known bool, err error) {
	writer, known, held, err := l.m.store.Writer(ctx, l.fence())
	switch {
	case err != nil:
		return "", false, fmt.Errorf("lease: read the writer of partition %d: %w", l.partition, err)
	case !held:
		return "", false, l.diagnose(ctx, nil, "read the writer", -1)
	}
	return writer, known, nil
}

// SetWriter records writer as the partition's writer into the target,
// fenced like Advance (an error matching ErrLeaseLost when the lease is no
// longer this one).
func (l *Lease) SetWriter(ctx context.Context, writer string) error {
	ok, err := l.m.store.SetWriter(ctx, l.fence(), writer)
	switch {
	case err != nil:
		return fmt.Errorf("lease: record the writer of partition %d: %w", l.partition, err)
	case !ok:
		return l.diagnose(ctx, nil, "record the writer", -1)
	}
	return nil
}
