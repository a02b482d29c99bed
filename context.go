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
// Handlers read the transaction back with PgxTxFromContext or
// SQLTxFromContext.
func WithTx(ctx context.Context, tx any) context.Context {
	return pgexec.WithTx(ctx, tx)
}

// TxFromContext returns the transaction stored by WithTx, if any, as it was
// given. PgxTxFromContext and SQLTxFromContext return it typed.
func TxFromContext(ctx context.Context) (any, bool) {
	b := pgexec.BindingFrom(ctx)
	if b == nil {
		return nil, false
	}
	return b.Tx, true
}

// PgxTxFromContext returns the pgx.Tx stored by WithTx, if there is one and
// it is a pgx.Tx (or a watermill-sql adapter of one, unwrapped): the
// transaction of a message delivered by a Subscriber of the Transactional
// strategy, for example.
func PgxTxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := TxFromContext(ctx)
	if !ok {
		return nil, false
	}
	switch t := tx.(type) {
	case pgx.Tx:
		return t, true
	case wsql.PgxTx: // (its Commit and Rollback take no context: not a pgx.Tx itself)
		return t.Tx, t.Tx != nil
	case *wsql.PgxTx:
		if t != nil {
			return t.Tx, t.Tx != nil
		}
	}
	return nil, false
}

// SQLTxFromContext returns the *sql.Tx stored by WithTx, if there is one
// and it is a *sql.Tx (or a watermill-sql adapter of one).
func SQLTxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := TxFromContext(ctx)
	if !ok {
		return nil, false
	}
	switch t := tx.(type) {
	case *sql.Tx:
		return t, t != nil
	case *wsql.StdSQLTx:
		if t == nil {
			return nil, false
		}
		return t.Tx, t.Tx != nil
	case wsql.StdSQLTx:
		return t.Tx, t.Tx != nil
	}
	return nil, false
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
