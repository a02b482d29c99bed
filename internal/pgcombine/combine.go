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
//
// A statement registered with [Combiner.Merge] goes further: the calls of
// it that meet in one round trip become one statement, which does for all
// of them at once what each call's statement does (a counted read of
// every partition woken by one sequencer pass, say, or all their cursor
// moves), and each caller gets its own rows back. What PostgreSQL spends
// per statement (parse, plan, executor start-up, the statement's
// snapshot) is then spent once per round trip, not once per partition.
package pgcombine

import (
	"context"
	"errors"
	"fmt"
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

	merges map[string]Merge // by the single statement's SQL; guarded by mu

	scanMu sync.Mutex  // guards types
	types  *pgtype.Map // decodes buffered rows (a connection's map is its own)

	roundTrips, statements, merged atomic.Int64
}

// Merge says how the calls of one statement (a query) that meet in a
// round trip become one statement.
type Merge struct {
	// Many is the statement that does, for every call at once, what the
	// single statement does for one: its first result column is the
	// call's ordinal (int8, 1 for the first call given to Args), its
	// other columns are the single statement's, in its order; the rows of
	// one call come in the order the single statement gives them.
	Many string
	// Args returns Many's arguments for the calls' arguments (each as the
	// caller gave it to Query), in the calls' order. An error sends each
	// call as its own statement.
	Args func(calls [][]any) ([]any, error)
	// Key, when set, names what a call works on (its row, say): two
	// calls of one key never share a merged statement, so that Many never
	// sees one row twice; the later goes as a statement of its own.
	Key func(args []any) string
}

var _ pgexec.Querier = (*Combiner)(nil)

// New returns a Combiner on pool.
func New(pool *pgxpool.Pool) *Combiner {
	return &Combiner{pool: pool, types: pgtype.NewMap()}
}

// Merge registers m for the query single: from now on the calls of single
// that meet in a round trip are sent as one statement, m.Many. Register
// before the first call of single.
func (c *Combiner) Merge(single string, m Merge) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.merges == nil {
		c.merges = map[string]Merge{}
	}
	c.merges[single] = m
}

// Stats reports the round trips sent and the statements they carried since
// New (statements run again alone after a failed round trip included; a
// merged statement counts once).
func (c *Combiner) Stats() (roundTrips, statements int64) {
	return c.roundTrips.Load(), c.statements.Load()
}

// Queued reports how many calls wait for the next round trip.
func (c *Combiner) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// MergedCalls reports how many calls went in merged statements since New.
func (c *Combiner) MergedCalls() int64 { return c.merged.Load() }

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
	if len(batch) == 1 {
		c.statements.Add(1)
		c.alone(ctx, batch[0])
		return
	}
	units := c.units(batch)
	c.statements.Add(int64(len(units)))
	b := &pgx.Batch{}
	for _, u := range units {
		b.Queue(u.sql, u.args...)
	}
	br := c.pool.SendBatch(ctx, b)
	failed := false
	for _, u := range units {
		switch {
		case len(u.calls) > 1:
			failed = c.split(br, u.calls) || failed
		case u.calls[0].exec:
			cl := u.calls[0]
			tag, err := br.Exec()
			cl.affected, cl.err = tag.RowsAffected(), err
			failed = failed || err != nil
		default:
			cl := u.calls[0]
			cl.rows, cl.err = c.buffer(br.Query())
			failed = failed || cl.err != nil
		}
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

// unit is one statement of a round trip: one call's, or the merged
// statement of several calls.
type unit struct {
	sql   string
	args  []any
	calls []*call
}

// units groups batch into the statements of its round trip: the calls of
// a merged query (two or more, of distinct keys) in one statement, at the
// place of the first of them; every other call in a statement of its own.
func (c *Combiner) units(batch []*call) []unit {
	c.mu.Lock()
	merges := c.merges
	c.mu.Unlock()
	var units []unit
	group := map[string]int{}            // merged query → its unit
	keys := map[string]map[string]bool{} // merged query → the keys in its unit
	for _, cl := range batch {
		if m, ok := merges[cl.sql]; ok && !cl.exec {
			key := ""
			if m.Key != nil {
				key = m.Key(cl.args)
			}
			i, open := group[cl.sql]
			switch {
			case !open: // the first call of the query: its unit
				group[cl.sql] = len(units)
				keys[cl.sql] = map[string]bool{key: true}
			case m.Key == nil || !keys[cl.sql][key]:
				units[i].calls = append(units[i].calls, cl)
				keys[cl.sql][key] = true
				continue
			} // (a key already in the unit: a statement of its own)
		}
		units = append(units, unit{sql: cl.sql, args: cl.args, calls: []*call{cl}})
	}
	merged := 0
	for i, u := range units {
		if len(u.calls) < 2 {
			continue
		}
		all := make([][]any, len(u.calls))
		for j, cl := range u.calls {
			all[j] = cl.args
		}
		args, err := merges[u.sql].Args(all)
		if err != nil {
			return c.unmerged(units)
		}
		units[i].sql, units[i].args = merges[u.sql].Many, args
		merged += len(u.calls)
	}
	c.merged.Add(int64(merged)) // (counted once every merge took its arguments)
	return units
}

// unmerged is units with every merged unit split back into its calls.
func (c *Combiner) unmerged(units []unit) []unit {
	var out []unit
	for _, u := range units {
		for _, cl := range u.calls {
			out = append(out, unit{sql: cl.sql, args: cl.args, calls: []*call{cl}})
		}
	}
	return out
}

// split reads a merged statement's result and gives each call its rows;
// failed reports that the statement failed (each call then has the error).
func (c *Combiner) split(br pgx.BatchResults, calls []*call) (failed bool) {
	all, err := c.buffer(br.Query())
	if err == nil && len(all.(*buffered).fields) == 0 {
		err = errors.New("pgcombine: a merged statement returned no columns")
	}
	if err != nil {
		for _, cl := range calls {
			cl.err = err
		}
		return true
	}
	b := all.(*buffered)
	fields := b.fields[1:]
	for _, cl := range calls {
		cl.rows = &buffered{c: c, fields: fields}
	}
	c.scanMu.Lock()
	defer c.scanMu.Unlock()
	for _, row := range b.rows {
		var i int64
		if err := pgx.ScanRow(c.types, b.fields[:1], row[:1], &i); err != nil || i < 1 || i > int64(len(calls)) {
			if err == nil {
				err = fmt.Errorf("pgcombine: a merged statement returned ordinal %d of %d calls", i, len(calls))
			}
			for _, cl := range calls {
				cl.rows, cl.err = nil, err
			}
			return true
		}
		r := calls[i-1].rows.(*buffered)
		r.rows = append(r.rows, row[1:])
	}
	return false
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
