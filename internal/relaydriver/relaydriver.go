// Package relaydriver is the seam between the log-based relay's logic
// (package relay: streaming the slot, skipping what was appended before a
// restart, confirming positions, batching, numbering, appending fenced by
// the position, ending stale appenders) and the PostgreSQL it runs on:
// the slot's replication stream and the append connection. The product
// runs it on PostgreSQL; the deterministic simulator (internal/sim) runs
// the same relay code on a model of the WAL, the slot and the tables it
// appends to.
package relaydriver

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/watermill-outbox/internal/pgrepl"
)

// Backend is PostgreSQL as a relay's stream uses it.
type Backend interface {
	// Stream opens a replication connection named name and starts
	// streaming slot from its confirmed position: a *pgconn.PgError
	// (SQLSTATE 55006) while another connection streams it. timeoutMS is
	// the server's wal_sender_timeout for it.
	Stream(ctx context.Context, slot, name string, timeoutMS int64) (Stream, error)
	// Conn opens the append connection named name: its statements wait at
	// most lockTimeoutMS for a lock (SQLSTATE 55P03), its transactions
	// idle at most idleMS.
	Conn(ctx context.Context, name string, lockTimeoutMS, idleMS int64) (Conn, error)
	// EndStaleAppenders ends the sessions of the append connections named
	// name other than the caller's, and returns how many it ended.
	EndStaleAppenders(ctx context.Context, name string) (int64, error)
}

// Stream is a replication stream (*pgrepl.Conn).
type Stream interface {
	Receive(ctx context.Context) (pgrepl.Event, error)
	SendStatus(flushed pgrepl.LSN, replyRequested bool) error
	Close(ctx context.Context) error
}

// Conn is the append connection (*pgx.Conn).
type Conn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
	Close(ctx context.Context) error
}

// Run makes a relay of cfg (a relay.Config, its Pool unused) on b and
// returns its loop (Relay.Run without the schema check and the retained
// WAL watch): it streams, waits as a standby and retries until ctx ends;
// jitter spreads its backoffs. Package relay sets it as it initialises;
// the simulator calls it. It is not part of the product's API.
var Run func(cfg any, logger watermill.LoggerAdapter, b Backend, jitter func(time.Duration) time.Duration) (func(ctx context.Context) error, error)
