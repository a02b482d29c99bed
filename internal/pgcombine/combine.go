// Package pgcombine sends statements that callers issue at about the same
// time to PostgreSQL together, in one round trip.
//
// A Subscriber's partitions each run their own small statements (the
// counted read of a batch, the cursor move after it). Woken together by
// one sequencer pass, a dozen workers each pay a round trip and a
// transaction of their own, and at light load that overhead, not the
// statements, is most of what PostgreSQL spends per message. A Combiner
// lets the first caller go at once, alone, and sends every statement that
// arrives while a round trip is in flight with the next one: one pipelined
// batch, one implicit transaction. Nobody waits on a timer; a lone caller
// costs what it did.
//
// What combining changes, and why only some statements may be given:
//   - the statements of one round trip commit together, with the
//     durability of the most relaxed of them: give only statements that
//     commit with synchronous_commit off (or that may);
//   - when one of them fails, the transaction's other statements are
//     rolled back with it: every caller of that round trip then runs its
//     statement again alone, on its own context, and gets that outcome;
//   - a statement must be a unit of its own (no BEGIN, COMMIT or SET
//     outside set_config(..., true)), and must not wait on another
//     caller's (rows of different callers, or locks taken with SKIP
//     LOCKED elsewhere), so that a round trip cannot deadlock on itself.
package pgcombine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/pgexec"
)

// Combiner runs statements on a pool, combining those issued while a round
// trip is in flight into the next one. It is a pgexec.Querier; the zero
// value is not usable (see New). Safe for concurrent use; it starts no
// goroutine: the caller whose statement opens a round trip sends it, and
// hands the next one to the first caller that queued meanwhile.
type Combiner struct {
	pool *pgxpool.Pool

	mu    sync.Mutex
	busy  bool    // a round trip is being sent
	queue []*call // what arrived meanwhile, in order

	scanMu sync.Mutex  // guards types
	types  *pgtype.Map // decodes buffered rows (a connection's map is its own)

	roundTrips, statements atomic.Int64
}

var _ pgexec.Querier = (*Combiner)(nil)

// New returns a Combiner on pool.
func New(pool *pgxpool.Pool) *Combiner {
	return &Combiner{pool: pool, types: pgtype.NewMap()}
}

// Stats reports the round trips sent and the statements they carried since
// New (statements run again alone after a failed round trip included).
func (c *Combiner) Stats() (roundTrips, statements int64) {
	return c.roundTrips.Load(), c.statements.Load()
}

// Exec implements pgexec.Querier.
func (c *Combiner) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	cl := &call{sql: sql, args: args, exec: true}
	if err := c.do(ctx, cl); err != nil {
		return 0, err
	}
	return cl.affected, nil
}

// Query implements pgexec.Querier. The rows of a combined round trip are
// read into memory before Query returns; those of a statement sent alone
// are the pool's own.
func (c *Combiner) Query(ctx context.Context, sql string, args ...any) (pgexec.Rows, error) {
	cl := &call{sql: sql, args: args}
	if err := c.do(ctx, cl); err != nil {
		return nil, err
	}
	return cl.rows, nil
}

// call is one statement and, once run, its outcome.
type call struct {
	sql  string
	args []any
	exec bool

	wake chan struct{} // buffered: the outcome is in, or lead is set
	lead bool          // this caller sends the next round trip

	rows     pgexec.Rows
	affected int64
	err      error
	again    bool // the round trip failed: run alone
}

// errRolledBack marks the statements of a round trip another statement
// made fail (internal: their callers run them again alone).
var errRolledBack = errors.New("pgcombine: rolled back with the round trip")

// do runs cl: at once when no round trip is in flight, else with the next.
func (c *Combiner) do(ctx context.Context, cl *call) error {
	c.mu.Lock()
	if c.busy {
		cl.wake = make(chan struct{}, 1)
		c.queue = append(c.queue, cl)
		c.mu.Unlock()
		select {
		case <-cl.wake:
		case <-ctx.Done():
			c.mu.Lock()
			if i := slices.Index(c.queue, cl); i >= 0 { // not taken yet: leave
				c.queue = slices.Delete(c.queue, i, i+1)
				c.mu.Unlock()
				return ctx.Err()
			}
			c.mu.Unlock()
			<-cl.wake // in a round trip in flight, or made its sender: both wake it
		}
		if !cl.lead {
			return c.outcome(ctx, cl)
		}
	} else {
		c.busy = true
		c.mu.Unlock()
	}

	c.mu.Lock()
	batch := append([]*call{cl}, c.queue...)
	c.queue = nil
	c.mu.Unlock()
	c.send(ctx, batch)
	c.mu.Lock()
	if len(c.queue) > 0 {
		next := c.queue[0]
		c.queue = c.queue[1:]
		next.lead = true
		next.wake <- struct{}{}
	} else {
		c.busy = false
	}
	c.mu.Unlock()
	return c.outcome(ctx, cl)
}

// outcome returns cl's error after its round trip, running it again alone
// when the round trip failed because of another statement (or of the
// sender's context).
func (c *Combiner) outcome(ctx context.Context, cl *call) error {
	if cl.again {
		cl.again = false
		c.roundTrips.Add(1)
		c.statements.Add(1)
		c.alone(ctx, cl)
	}
	return cl.err
}

// send runs batch in one round trip and wakes every caller but the first
// (the sender).
func (c *Combiner) send(ctx context.Context, batch []*call) {
	c.roundTrips.Add(1)
	c.statements.Add(int64(len(batch)))
	if len(batch) == 1 {
		c.alone(ctx, batch[0])
		return
	}
	b := &pgx.Batch{}
	for _, cl := range batch {
		b.Queue(cl.sql, cl.args...)
	}
	br := c.pool.SendBatch(ctx, b)
	failed := false
	for _, cl := range batch {
		if cl.exec {
			tag, err := br.Exec()
			cl.affected, cl.err = tag.RowsAffected(), err
		} else {
			cl.rows, cl.err = c.buffer(br.Query())
		}
		failed = failed || cl.err != nil
	}
	if err := br.Close(); err != nil {
		failed = true
	}
	for i, cl := range batch {
		if failed {
			cl.rows, cl.affected, cl.err, cl.again = nil, 0, errRolledBack, true
		}
		if i > 0 {
			cl.wake <- struct{}{}
		}
	}
}

// alone runs cl in a round trip of its own.
func (c *Combiner) alone(ctx context.Context, cl *call) {
	cl.err = nil
	if cl.exec {
		tag, err := c.pool.Exec(ctx, cl.sql, cl.args...)
		cl.affected, cl.err = tag.RowsAffected(), err
		return
	}
	rows, err := c.pool.Query(ctx, cl.sql, cl.args...)
	if err != nil {
		cl.err = err
		return
	}
	cl.rows = rows
}

// buffer reads rows into memory (their values are the connection's
// buffers, reused by the next statement of the batch).
func (c *Combiner) buffer(rows pgx.Rows, err error) (pgexec.Rows, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	b := &buffered{c: c, fields: slices.Clone(rows.FieldDescriptions())}
	for rows.Next() {
		raw := rows.RawValues()
		row := make([][]byte, len(raw))
		for i, v := range raw {
			if v != nil {
				row[i] = slices.Clone(v)
			}
		}
		b.rows = append(b.rows, row)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return b, nil
}

// buffered is a result read into memory.
type buffered struct {
	c      *Combiner
	fields []pgconn.FieldDescription
	rows   [][][]byte
	next   int // rows[next-1] is the current row
	err    error
}

func (b *buffered) Next() bool {
	if b.err != nil || b.next >= len(b.rows) {
		return false
	}
	b.next++
	return true
}

func (b *buffered) Scan(dest ...any) error {
	if b.next == 0 || b.next > len(b.rows) {
		return errors.New("pgcombine: Scan without a current row")
	}
	b.c.scanMu.Lock()
	defer b.c.scanMu.Unlock()
	if err := pgx.ScanRow(b.c.types, b.fields, b.rows[b.next-1], dest...); err != nil {
		b.err = err
		return err
	}
	return nil
}

func (b *buffered) Err() error { return b.err }

func (b *buffered) Close() { b.next = len(b.rows) }
