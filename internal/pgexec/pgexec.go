// Package pgexec runs the outbox's SQL over whatever handle the caller has:
// pgx (a pgx.Tx, *pgx.Conn, *pgxpool.Pool), database/sql (*sql.Tx, *sql.DB,
// *sql.Conn) or a watermill-sql executor. It exists so that the rest of the
// outbox is written once against one small interface.
package pgexec

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Rows is the subset of a result set the outbox reads.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Querier runs statements.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (rowsAffected int64, err error)
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// Tx is an open transaction.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// DB runs statements and begins transactions.
type DB interface {
	Querier
	Begin(ctx context.Context) (Tx, error)
}

type pgxQueryer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type pgxBeginner interface {
	pgxQueryer
	Begin(ctx context.Context) (pgx.Tx, error)
}

type stdQueryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type stdBeginner interface {
	stdQueryer
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// FromTx adapts a caller's transaction to a Querier. Supported: pgx.Tx,
// *sql.Tx and watermill-sql transactions (anything with ExecContext and
// QueryContext, or pgx's Exec and Query, that also has Commit and
// Rollback), and a *pgx.Conn, whose transaction status is checked at every
// statement. nil gives sentinel.ErrNilTx, an unknown type sentinel.ErrUnsupportedTx,
// and a handle that is not a transaction (a pool, *sql.DB, *sql.Conn,
// watermill-sql Beginner) a *outboxtype.NotInTxError: a statement on it would
// commit on its own. A *sql.Conn is refused even after a raw BEGIN, as
// database/sql cannot tell whether one is in progress.
func FromTx(tx any) (Querier, error) {
	if isNil(tx) {
		return nil, sentinel.ErrNilTx
	}
	if conn, ok := tx.(*pgx.Conn); ok {
		// A connection is accepted while it is in a transaction (BEGIN
		// run on it), checked at every statement.
		return connQ{conn}, nil
	}
	var q Querier
	switch t := tx.(type) {
	case pgxQueryer: // also watermill-sql's PgxTx, which embeds a pgx.Tx
		q = pgxQ{t}
	case stdQueryer:
		q = stdQ{t}
	case wsql.ContextExecutor:
		q = wmQ{t}
	default:
		return nil, fmt.Errorf("%w: %T (want a pgx.Tx, *sql.Tx or a watermill-sql executor)", sentinel.ErrUnsupportedTx, tx)
	}
	if !isTx(tx) {
		return nil, &outboxtype.NotInTxError{Type: fmt.Sprintf("%T", tx)}
	}
	return q, nil
}

// isTx reports whether v is a transaction: it has Commit and Rollback
// methods (pgx.Tx, *sql.Tx, watermill-sql's Tx adapters), unlike a pool, a
// *sql.DB or a *sql.Conn.
func isTx(v any) bool {
	t := reflect.TypeOf(v)
	_, commit := t.MethodByName("Commit")
	_, rollback := t.MethodByName("Rollback")
	return commit && rollback
}

// Identity returns a comparable key for the database that q runs on, when
// it can be told without a round trip, and nil otherwise. For pgx handles
// (a pgx.Tx, a *pgx.Conn, anything with a Conn() *pgx.Conn method) it is
// the server address and database name of the connection, so that a cache
// keyed by it holds one entry per database however many transactions are
// adapted; database/sql and watermill-sql handles give nil (a *sql.Tx does
// not reveal its database).
func Identity(q Querier) any {
	var conn *pgx.Conn
	switch t := q.(type) {
	case connQ:
		conn = t.c
	case pgxDB: // FromDB of a *pgx.Conn (a pool has no single connection: nil)
		return Identity(t.pgxQ)
	case pgxQ:
		switch h := t.q.(type) {
		case *pgx.Conn:
			conn = h
		case interface{ Conn() *pgx.Conn }: // pgx.Tx, *pgxpool.Conn
			conn = h.Conn()
		}
	}
	if conn == nil || conn.PgConn() == nil || conn.PgConn().Conn() == nil {
		return nil
	}
	addr := conn.PgConn().Conn().RemoteAddr()
	if addr == nil {
		return nil
	}
	return databaseID{network: addr.Network(), addr: addr.String(), database: conn.Config().Database}
}

// databaseID is the key Identity returns.
type databaseID struct{ network, addr, database string }

// connQ runs statements on a *pgx.Conn that must be in a transaction.
type connQ struct{ c *pgx.Conn }

func (c connQ) check() error {
	if s := c.c.PgConn().TxStatus(); s != 'T' && s != 'E' {
		return &outboxtype.NotInTxError{Type: "*pgx.Conn outside a transaction"}
	}
	return nil
}

func (c connQ) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return pgxQ{c.c}.Exec(ctx, sql, args...)
}

func (c connQ) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	return pgxQ{c.c}.Query(ctx, sql, args...)
}

// FromDB adapts a database handle that can begin transactions: a
// *pgxpool.Pool or *pgx.Conn, or a *sql.DB or *sql.Conn.
func FromDB(db any) (DB, error) {
	if isNil(db) {
		return nil, fmt.Errorf("%w: nil database handle", sentinel.ErrUnsupportedTx)
	}
	if c, ok := db.(interface{ IsClosed() bool }); ok && c.IsClosed() {
		return nil, fmt.Errorf("%w: the %T is closed: pass an open connection (or a *pgxpool.Pool, which reconnects)", sentinel.ErrClosed, db)
	}
	switch d := db.(type) {
	case pgxBeginner:
		return pgxDB{pgxQ{d}, d}, nil
	case stdBeginner:
		return stdDB{stdQ{d}, d}, nil
	}
	return nil, fmt.Errorf("%w: %T (want a *pgxpool.Pool, *pgx.Conn or *sql.DB)", sentinel.ErrUnsupportedTx, db)
}

// QueryRow runs a query that returns at most one row and scans it. It
// reports pgx.ErrNoRows when there is none.
func QueryRow(ctx context.Context, q Querier, sql string, args []any, dest ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// InTx runs fn in a transaction of db, committing when fn returns nil and
// rolling back otherwise.
func InTx(ctx context.Context, db DB, fn func(tx Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return tx.Commit(ctx)
}

type pgxQ struct{ q pgxQueryer }

func (p pgxQ) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := p.q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (p pgxQ) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	rows, err := p.q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

type pgxDB struct {
	pgxQ
	b pgxBeginner
}

func (p pgxDB) Begin(ctx context.Context) (Tx, error) {
	tx, err := p.b.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgxTx{pgxQ{tx}, tx}, nil
}

type pgxTx struct {
	pgxQ
	tx pgx.Tx
}

func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

type stdQ struct{ q stdQueryer }

func (s stdQ) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return n, nil
}

func (s stdQ) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rows, err := s.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return stdRows{rows}, nil
}

type stdRows struct{ *sql.Rows }

func (r stdRows) Close() { _ = r.Rows.Close() }

type stdDB struct {
	stdQ
	b stdBeginner
}

func (s stdDB) Begin(ctx context.Context) (Tx, error) {
	tx, err := s.b.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return stdTx{stdQ{tx}, tx}, nil
}

type stdTx struct {
	stdQ
	tx *sql.Tx
}

func (t stdTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t stdTx) Rollback(context.Context) error { return t.tx.Rollback() }

type wmQ struct{ q wsql.ContextExecutor }

func (w wmQ) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := w.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return n, nil
}

func (w wmQ) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rows, err := w.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return wmRows{r: rows}, nil
}

// wmRows adapts watermill-sql's Rows, which has no Err method: Close
// reports the iteration error there.
type wmRows struct{ r wsql.Rows }

func (w wmRows) Next() bool             { return w.r.Next() }
func (w wmRows) Scan(dest ...any) error { return w.r.Scan(dest...) }
func (w wmRows) Err() error {
	if e, ok := w.r.(interface{ Err() error }); ok {
		return e.Err()
	}
	return nil
}
func (w wmRows) Close() { _ = w.r.Close() }
