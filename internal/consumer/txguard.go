package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/millrace/watermill-outbox/outboxtype"
)

const (
	// misuseAborted: the handler acked, but a statement it ran failed and
	// aborted the transaction (SQLSTATE 25P02 on the next statement).
	misuseAborted = "acked, but a statement it ran in the transaction failed, which aborts the whole transaction (e.g. a unique violation used as an idempotency check): " +
		"run statements that may fail inside a nested transaction (tx.Begin, then Rollback on error), or return the error so the message is retried"
	misuseCommit   = "called Commit on the Subscriber's transaction: the Subscriber commits it, with the cursor, after the handler acks; return an error (or Nack) to undo this message's writes instead"
	misuseRollback = "called Rollback on the Subscriber's transaction: return an error (or Nack) to undo this message's writes; the Subscriber rolls back to the message's savepoint"
	misuseEnded    = "ended or broke the Subscriber's transaction (e.g. a raw COMMIT, ROLLBACK or RELEASE through tx.Conn()): the transaction cannot go on"
)

// errDeliveryAbandoned is returned by a guarded transaction whose delivery
// timed out: the Subscriber has given the transaction up.
var errDeliveryAbandoned = errors.New("outbox: this delivery timed out (HandlerTimeout) and its transaction was rolled back: the handler's work is discarded")

// txGuard is the pgx.Tx a Transactional handler gets: the batch's
// transaction, except that Commit and Rollback are refused (and recorded as
// misuse), and that once the delivery is abandoned after HandlerTimeout
// every call fails instead of touching a transaction the Subscriber is
// rolling back. Nested transactions (Begin) are guarded the same way but
// commit and roll back normally. Conn() and LargeObjects() reach the
// connection unguarded.
type txGuard struct {
	tx     pgx.Tx
	state  *guardState
	nested bool
}

type guardState struct {
	// inCall holds a token while a handler's call runs on the connection;
	// abandon takes it to know the connection is free.
	inCall chan struct{}

	mu        sync.Mutex
	abandoned bool
	misuse    string
}

func newTxGuard(tx pgx.Tx) *txGuard {
	return &txGuard{tx: tx, state: &guardState{inCall: make(chan struct{}, 1)}}
}

// enter marks a call of the handler's as running; leave ends it.
func (g *txGuard) enter() error {
	g.state.inCall <- struct{}{}
	g.state.mu.Lock()
	abandoned := g.state.abandoned
	g.state.mu.Unlock()
	if abandoned {
		<-g.state.inCall
		return errDeliveryAbandoned
	}
	return nil
}

func (g *txGuard) leave() { <-g.state.inCall }

func (g *txGuard) setMisuse(what string) {
	g.state.mu.Lock()
	defer g.state.mu.Unlock()
	if g.state.misuse == "" {
		g.state.misuse = what
	}
}

// takeMisuse returns and clears what the handler did wrong ("" for nothing).
func (g *txGuard) takeMisuse() string {
	g.state.mu.Lock()
	defer g.state.mu.Unlock()
	m := g.state.misuse
	g.state.misuse = ""
	return m
}

// abandon gives the transaction up after a handler timed out: every later
// call of the handler fails, and the transaction is rolled back as soon as
// no call of the handler's runs on it (a running query is cancelled on the
// server first). The rollback is one of tasks (the Subscriber's Close
// waits for it); it gives up waiting for the handler's call once the
// tasks stop (plus grace), leaving the connection to die with the call.
func (g *txGuard) abandon(tasks *Tasks, grace time.Duration, logf func(error)) {
	g.state.mu.Lock()
	g.state.abandoned = true
	g.state.mu.Unlock()
	tasks.Go(func(stop context.Context) {
		select {
		case g.state.inCall <- struct{}{}:
		default:
			// A call of the handler's is running on the connection: cancel
			// it on the server, then wait for it to return.
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = g.tx.Conn().PgConn().CancelRequest(cctx)
			cancel()
			stopped, giveUp := stop.Done(), (<-chan time.Time)(nil)
		wait:
			for {
				select {
				case g.state.inCall <- struct{}{}:
					break wait
				case <-stopped:
					stopped, giveUp = nil, time.After(grace)
				case <-giveUp:
					logf(errors.New("a timed-out handler's database call did not return: its transaction is left to end with its connection"))
					return
				}
			}
		}
		defer func() { <-g.state.inCall }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// A failed rollback closes the connection, which ends the
		// transaction on the server all the same.
		_ = g.tx.Rollback(ctx)
	})
}

// Begin starts a nested transaction (a savepoint), guarded like this one.
func (g *txGuard) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := g.enter(); err != nil {
		return nil, err
	}
	defer g.leave()
	tx, err := g.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &txGuard{tx: tx, state: g.state, nested: true}, nil
}

// Commit releases a nested transaction; on the Subscriber's own
// transaction it is refused with an sentinel.ErrTxMisuse error and counted against
// the delivery.
func (g *txGuard) Commit(ctx context.Context) error {
	if !g.nested {
		g.setMisuse(misuseCommit)
		return &outboxtype.TxMisuseError{What: misuseCommit}
	}
	if err := g.enter(); err != nil {
		return err
	}
	defer g.leave()
	return g.tx.Commit(ctx)
}

// Rollback rolls a nested transaction back; on the Subscriber's own
// transaction it is refused with an sentinel.ErrTxMisuse error and counted against
// the delivery.
func (g *txGuard) Rollback(ctx context.Context) error {
	if !g.nested {
		g.setMisuse(misuseRollback)
		return &outboxtype.TxMisuseError{What: misuseRollback}
	}
	if err := g.enter(); err != nil {
		return err
	}
	defer g.leave()
	return g.tx.Rollback(ctx)
}

// CopyFrom runs COPY FROM in the transaction.
func (g *txGuard) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := g.enter(); err != nil {
		return 0, err
	}
	defer g.leave()
	return g.tx.CopyFrom(ctx, table, columns, src)
}

// SendBatch sends a batch of statements in the transaction.
func (g *txGuard) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := g.enter(); err != nil {
		return errBatchResults{err}
	}
	defer g.leave()
	return g.tx.SendBatch(ctx, b)
}

// LargeObjects gives access to large objects in the transaction
// (unguarded).
func (g *txGuard) LargeObjects() pgx.LargeObjects { return g.tx.LargeObjects() }

// Prepare prepares a statement on the transaction's connection.
func (g *txGuard) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := g.enter(); err != nil {
		return nil, err
	}
	defer g.leave()
	return g.tx.Prepare(ctx, name, sql)
}

// Exec runs a statement in the transaction.
func (g *txGuard) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := g.enter(); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer g.leave()
	return g.tx.Exec(ctx, sql, args...)
}

// Query runs a query in the transaction.
func (g *txGuard) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := g.enter(); err != nil {
		return nil, err
	}
	defer g.leave()
	return g.tx.Query(ctx, sql, args...)
}

// QueryRow runs a query expected to return at most one row.
func (g *txGuard) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := g.enter(); err != nil {
		return errRow{err}
	}
	defer g.leave()
	return g.tx.QueryRow(ctx, sql, args...)
}

// Conn returns the transaction's connection (unguarded: statements that
// end the transaction through it break the delivery; see sentinel.ErrTxMisuse).
func (g *txGuard) Conn() *pgx.Conn { return g.tx.Conn() }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatchResults struct{ err error }

func (r errBatchResults) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, r.err }
func (r errBatchResults) Query() (pgx.Rows, error)         { return nil, r.err }
func (r errBatchResults) QueryRow() pgx.Row                { return errRow(r) }
func (r errBatchResults) Close() error                     { return r.err }

var _ pgx.Tx = (*txGuard)(nil)

func (r errBatchResults) Tx() pgx.Tx { return nil }
