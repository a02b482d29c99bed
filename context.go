package outbox

import (
	"context"
	"database/sql"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/pgexec"
)

// WithTx returns a context that carries tx, the caller's open transaction: a
// pgx.Tx, a *sql.Tx or a watermill-sql executor. A Publisher created with
// NewPublisher writes a message into the transaction found in the message's
// context, so set it with msg.SetContext(outbox.WithTx(ctx, tx)) — or, in a
// Router handler, on the context of the messages the handler returns.
//
// A nil or unsupported tx is reported by Publish (ErrNilTx,
// ErrUnsupportedTx), not here, so that the error surfaces where it matters;
// so is a handle that is not a transaction (ErrNotInTx): a pool, a *sql.DB,
// a *sql.Conn, or a *pgx.Conn on which no BEGIN is in progress. Such a
// handle would write the message on its own, outside the caller's
// transaction, and the message would survive the caller's rollback.
//
// Handlers read the transaction back with TxFromContext:
// TxFromContext[pgx.Tx](ctx), or TxFromContext[*sql.Tx](ctx).
func WithTx(ctx context.Context, tx any) context.Context {
	return pgexec.WithTx(ctx, tx)
}

// TxFromContext returns the transaction stored by WithTx as a T, if there
// is one and it is a T: TxFromContext[pgx.Tx](ctx) in a handler of a
// Subscriber of the Transactional strategy, TxFromContext[*sql.Tx](ctx) for
// a transaction of database/sql. A watermill-sql adapter (sql.PgxTx,
// sql.StdSQLTx) is a T itself, or, unwrapped, the pgx.Tx or *sql.Tx it
// holds. TxFromContext[any] returns the transaction as it was given.
func TxFromContext[T any](ctx context.Context) (T, bool) {
	var zero T
	b := pgexec.BindingFrom(ctx)
	if b == nil || b.Tx == nil {
		return zero, false
	}
	if t, ok := b.Tx.(T); ok {
		return t, !isNilTx(b.Tx)
	}
	inner := unwrapTx(b.Tx)
	if inner == nil {
		return zero, false
	}
	t, ok := inner.(T)
	return t, ok
}

// unwrapTx returns the pgx.Tx or *sql.Tx a watermill-sql adapter holds
// (nil for none, or for another handle).
func unwrapTx(tx any) any {
	switch t := tx.(type) {
	case wsql.PgxTx: // (its Commit and Rollback take no context: not a pgx.Tx itself)
		if t.Tx != nil {
			return t.Tx
		}
	case *wsql.PgxTx:
		if t != nil && t.Tx != nil {
			return t.Tx
		}
	case wsql.StdSQLTx:
		if t.Tx != nil {
			return t.Tx
		}
	case *wsql.StdSQLTx:
		if t != nil && t.Tx != nil {
			return t.Tx
		}
	}
	return nil
}

// isNilTx reports whether tx is a typed nil pointer of the handles WithTx
// takes.
func isNilTx(tx any) bool {
	switch t := tx.(type) {
	case *sql.Tx:
		return t == nil
	case *wsql.PgxTx:
		return t == nil
	case *wsql.StdSQLTx:
		return t == nil
	}
	return false
}

// DB is the set of database handles the outbox's one-off operations
// (Migrate, CurrentSchemaVersion, RegisterTopic, TopicPartitions) accept: a
// pgx pool or connection, or a database/sql handle. Any other handle is a
// compile error.
//
// The handles accepted across the outbox, in one place:
//
//   - Migrate, CurrentSchemaVersion, RegisterTopic, TopicPartitions: a DB.
//   - PublisherConfig.DB (to register topics and, with OwnTransaction,
//     write in a transaction of its own): a *pgxpool.Pool, *pgx.Conn or
//     *sql.DB, checked by Validate.
//   - The caller's transaction (WithTx, NewTxPublisher): a pgx.Tx, a *sql.Tx
//     or a watermill-sql executor of one, checked at Publish (ErrNotInTx,
//     ErrUnsupportedTx). Go cannot type "pgx.Tx or *sql.Tx" at compile time
//     (pgx.Tx is an interface with methods, which a type union cannot
//     hold), so these stay `any`.
//   - Sequencer, Subscriber, Forwarder, admin, retention, deadletter: a
//     *pgxpool.Pool, because they hold connections of their own (LISTEN,
//     one per partition worker) and need the pool to hand them out.
type DB interface {
	*pgxpool.Pool | *pgx.Conn | *sql.DB | *sql.Conn
}
