package sim

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/direct"
	"github.com/millrace/watermill-outbox/internal/lease"
)

// The model of pending for forwarder-only topics (outbox.ForwardOnly,
// internal/direct): the rows publishers commit, which the forwarders read
// (PendingForwardRead) and delete in the statement that moves their
// cursors (PendingForwarded), with PostgreSQL's semantics where the
// protocol depends on them:
//
//   - a row's id is drawn when its transaction inserts it and the row is
//     seen only once that transaction commits, so a row can appear after
//     rows with greater ids were read (a publisher's late commit);
//   - a row deleted by an open transaction is still seen by others, and
//     another DELETE of it waits for that transaction; once it committed
//     the row is gone (READ COMMITTED re-checks), once it rolled back the
//     row is there;
//   - partitions.last_seq follows the cursors.
//
// integration/sim runs the same scenarios through it and through
// PostgreSQL and compares.

// pendingRow is a committed pending row.
type pendingRow struct {
	id        int64
	partition int
	uuid, key string
	payload   []byte
	poison    bool
}

// pendingState is the database's pending rows and partitions' last seqs
// of the forwarder-only topic (part of db).
type pendingState struct {
	rows     map[int64]*pendingRow // committed, not deleted
	nextID   int64                 // the identity's last value
	lastSeq  map[int]int64         // partitions.last_seq
	rowLocks map[int64]*dbTx       // rows deleted by open transactions
}

func (d *db) pendingState() *pendingState {
	if d.pend == nil {
		d.pend = &pendingState{rows: map[int64]*pendingRow{}, lastSeq: map[int]int64{}, rowLocks: map[int64]*dbTx{}}
	}
	return d.pend
}

// insertPending draws ids for rows (a publisher's INSERT in its open
// transaction): they are seen once commitPending makes them so.
func (d *db) insertPending(rows []pendingRow) []pendingRow {
	ps := d.pendingState()
	for i := range rows {
		ps.nextID++
		rows[i].id = ps.nextID
	}
	return rows
}

// commitPending commits a publisher's transaction of rows
// (synchronously: flushed).
func (d *db) commitPending(rows []pendingRow) {
	ps := d.pendingState()
	for _, r := range rows {
		ps.rows[r.id] = &r
	}
	d.flush()
}

// pendingByID returns the committed pending rows by id.
func (d *db) pendingByID() []*pendingRow {
	ps := d.pendingState()
	ids := slices.Sorted(maps.Keys(ps.rows))
	out := make([]*pendingRow, len(ids))
	for i, id := range ids {
		out[i] = ps.rows[id]
	}
	return out
}

// pendingLeft returns how many committed rows wait in pending.
func (d *db) pendingLeft() int { return len(d.pendingState().rows) }

var _ direct.Store = (*conn)(nil)

// ReadPending is PendingForwardRead: per partition asked, its first limit
// committed rows by id.
func (c *conn) ReadPending(ctx context.Context, _ string, partitions []int32, limit int, _ time.Time) ([]direct.Row, error) {
	var out []direct.Row
	err := c.run(roleOf(ctx, "db"), c.detail("db.read_pending", "%v limit %d", partitions, limit), nil, func() error {
		ps := c.d.pendingState()
		ids := make([]int64, 0, len(ps.rows))
		for id := range ps.rows {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, p := range slices.Sorted(slices.Values(partitions)) {
			n := 0
			for _, id := range ids {
				r := ps.rows[id]
				if r.partition != int(p) || n >= limit {
					continue
				}
				n++
				out = append(out, direct.Row{
					Partition: r.partition, ID: r.id, UUID: r.uuid, Key: r.key,
					Metadata: map[string]string{}, Payload: append([]byte(nil), r.payload...),
				})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Forwarded is PendingForwarded in tx (nil: a statement of its own): each
// move whose lease holds (and whose cursor is not past it) moves its
// cursor, deletes its rows and raises its partition's last seq.
func (c *conn) Forwarded(ctx context.Context, tx pgx.Tx, group, topic, owner string, moves []direct.Move) (map[int]bool, error) {
	t, err := c.tx(tx)
	if err != nil {
		return nil, err
	}
	own := t
	if own == nil {
		// A statement of its own is a transaction of its own.
		own = &simTx{c: c, tx: c.d.begin(), role: roleOf(ctx, "db")}
	}
	holds := func(m direct.Move) bool {
		r := c.d.cursor(own.dbTx(), cursorKey{group, topic, m.Partition})
		f := lease.Fence{Group: lease.Group{Name: group, Topic: topic}, Partition: m.Partition, Member: owner, Token: m.Token}
		return c.holds(r, f) && r.seq <= m.Last
	}
	// It waits for the cursor rows, then for the rows it deletes that
	// another transaction deleted and has not ended.
	ready := func() bool {
		ps := c.d.pendingState()
		for _, m := range moves {
			if c.d.lockedFor(own.dbTx(), cursorKey{group, topic, m.Partition}) {
				return false
			}
		}
		for _, m := range moves {
			if !holds(m) {
				continue
			}
			for _, id := range m.IDs {
				if l, ok := ps.rowLocks[id]; ok && l != own.dbTx() {
					return false
				}
			}
		}
		return true
	}
	moved := map[int]bool{}
	err = c.in(ctx, t, c.detail("db.forwarded", "%v", moves), ready, func() error {
		tx := own.dbTx()
		if tx.crashes != c.d.crashes {
			return errConnection
		}
		for _, m := range moves {
			if !holds(m) {
				continue
			}
			moved[m.Partition] = true
			c.d.write(tx, cursorKey{group, topic, m.Partition}, false, func(r *cursorRow) {
				r.seq, r.attempts, r.unexplained, r.deliveries = m.Last, 0, 0, 0
				r.inflightFrom, r.inflightTo, r.inflightSolo = 0, 0, false
				r.backoffUntil, r.lastError = time.Time{}, ""
			})
			tx.stagePending(m.Partition, m.Last, m.IDs)
		}
		if t == nil {
			return tx.commit()
		}
		return nil
	})
	if t == nil {
		own.tx.rollback()
	}
	if err != nil {
		if errors.Is(err, errConnection) && t == nil {
			// Whether the statement took effect is unknown to the caller.
			return nil, err
		}
		return nil, err
	}
	return moved, nil
}

// stagePending stages in tx the deletion of a partition's rows ids (those
// still committed) and its last seq.
func (t *dbTx) stagePending(partition int, last int64, ids []int64) {
	ps := t.d.pendingState()
	if t.pendGone == nil {
		t.pendGone = map[int64]bool{}
		t.pendLast = map[int]int64{}
	}
	for _, id := range ids {
		if _, ok := ps.rows[id]; ok && !t.pendGone[id] {
			t.pendGone[id] = true
			ps.rowLocks[id] = t
		}
	}
	t.pendLast[partition] = max(t.pendLast[partition], last)
}

// commitPendingWrites applies tx's pending writes (at its commit).
func (t *dbTx) commitPendingWrites() {
	if t.pendGone == nil {
		return
	}
	ps := t.d.pendingState()
	for id := range t.pendGone {
		delete(ps.rows, id)
	}
	for p, last := range t.pendLast {
		ps.lastSeq[p] = max(ps.lastSeq[p], last)
	}
}

// releasePending drops tx's row locks (at its end).
func (t *dbTx) releasePending() {
	if t.pendGone == nil {
		return
	}
	ps := t.d.pendingState()
	for id := range t.pendGone {
		if ps.rowLocks[id] == t {
			delete(ps.rowLocks, id)
		}
	}
}
