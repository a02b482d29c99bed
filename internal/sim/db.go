package sim

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// The database model: the rows the forwarding path reads and writes —
// the log, the partitions' next seqs, the consumer group's cursor rows and
// member rows, the dead letters — with PostgreSQL's semantics where the
// protocol depends on them:
//
//   - a transaction's writes are seen by others only when it commits
//     (READ COMMITTED), and the cursor rows it wrote stay locked until it
//     ends: a fenced UPDATE of another session waits for the lock, a
//     SELECT ... FOR UPDATE SKIP LOCKED (acquire, renew, release) skips
//     the row;
//   - a commit with synchronous_commit off (the counted read, relaxed
//     cursor moves) is lost when the server crashes before the WAL writer
//     flushed it; a synchronous commit flushes everything before it;
//   - a crash aborts every open transaction and breaks every connection.
//
// The statements themselves (dbstore.go) follow internal/dbsql's SQL
// line by line; integration/sim runs the same scenarios through them and
// through PostgreSQL and compares.

// tp is a topic's partition.
type tp struct {
	topic     string
	partition int
}

// logRow is one message of the log.
type logRow struct {
	seq      int64
	uuid     string
	key      string
	metadata map[string]string
	payload  []byte
	poison   bool // larger than the broker's max message size
}

// cursorKey names a cursor row.
type cursorKey struct {
	group, topic string
	partition    int
}

// cursorRow is a cursor row (cursors.sql).
type cursorRow struct {
	seq                      int64
	owner                    string // "" for NULL
	token                    int64
	expires                  time.Time // zero for NULL
	paused                   bool
	attempts                 int64
	deliveries               int64
	unexplained              int64
	inflightFrom, inflightTo int64
	inflightSolo             bool
	suspectFrom, suspectTo   int64
	lastError                string // "" for NULL
	backoffUntil             time.Time
	adaptive                 string
	// writer: the transactional id recorded by SetWriter; writerNull: the
	// row predates writer records (NULL).
	writer     string
	writerNull bool
}

// memberKey names a member row.
type memberKey struct{ group, topic, member string }

type memberRow struct {
	heartbeat time.Time
	ttl       time.Duration
}

// deadLetter is a dead_letters row.
type deadLetter struct {
	group     string
	topic     string
	partition int
	seq       int64
	uuid      string
	reason    string
	attempts  int
}

// db is the database's state.
type db struct {
	now      func() time.Time
	log      map[tp][]logRow // seqs 1..n
	cursors  map[cursorKey]*cursorRow
	members  map[memberKey]*memberRow
	dead     []deadLetter
	locks    map[cursorKey]*dbTx // cursor rows locked by open transactions
	open     map[*dbTx]bool
	unsynced []undo // commits with synchronous_commit off not yet flushed
	// down: the server is down (crashed) until then.
	down time.Time
	// crashes counts the crashes; a session opened before the last one
	// is broken.
	crashes int
	// pend: the forwarder-only topic's pending rows (pending.go).
	pend *pendingState
}

// undo restores a cursor row (nil: the row did not exist) when an
// unflushed commit is lost.
type undo struct {
	key  cursorKey
	prev *cursorRow
}

func newDB(now func() time.Time) *db {
	return &db{now: now, log: map[tp][]logRow{}, cursors: map[cursorKey]*cursorRow{}, members: map[memberKey]*memberRow{},
		locks: map[cursorKey]*dbTx{}, open: map[*dbTx]bool{}}
}

// dbTx is an open transaction: its writes are staged until commit.
type dbTx struct {
	d       *db
	rows    map[cursorKey]*cursorRow // staged cursor rows (locked)
	dead    []deadLetter
	crashes int // the server's crash count when it began
	done    bool
	// Forwarder-only topics (pending.go): rows deleted, last seqs.
	pendGone map[int64]bool
	pendLast map[int]int64
}

func (d *db) begin() *dbTx {
	t := &dbTx{d: d, rows: map[cursorKey]*cursorRow{}, crashes: d.crashes}
	d.open[t] = true
	return t
}

// cursor returns the row of k as tx sees it (nil tx: as committed), nil
// when there is none.
func (d *db) cursor(tx *dbTx, k cursorKey) *cursorRow {
	if tx != nil {
		if r, ok := tx.rows[k]; ok {
			return r
		}
	}
	return d.cursors[k]
}

// lockedFor reports whether k is locked by an open transaction other than
// tx.
func (d *db) lockedFor(tx *dbTx, k cursorKey) bool {
	l, ok := d.locks[k]
	return ok && l != tx
}

// write applies a change to row k: staged in tx (which locks the row), or
// committed at once (relaxed: not flushed yet). The row must not be locked
// by another transaction (the caller waited).
func (d *db) write(tx *dbTx, k cursorKey, relaxed bool, change func(r *cursorRow)) {
	if tx != nil {
		r, ok := tx.rows[k]
		if !ok {
			c := *d.cursors[k]
			r = &c
			tx.rows[k] = r
			d.locks[k] = tx
		}
		change(r)
		return
	}
	prev := d.cursors[k]
	c := *prev
	change(&c)
	d.cursors[k] = &c
	if relaxed {
		d.unsynced = append(d.unsynced, undo{key: k, prev: prev})
	} else {
		d.flush()
	}
}

// commit makes tx's writes visible and durable (a synchronous commit
// flushes the WAL before it too).
func (t *dbTx) commit() error {
	d := t.d
	if t.done {
		return fmt.Errorf("sim: commit of an ended transaction")
	}
	t.end()
	if t.crashes != d.crashes {
		return errConnection
	}
	for k, r := range t.rows {
		d.cursors[k] = r
	}
	t.commitPendingWrites()
	d.dead = append(d.dead, t.dead...)
	d.flush()
	return nil
}

// rollback drops tx's writes.
func (t *dbTx) rollback() {
	if !t.done {
		t.end()
	}
}

func (t *dbTx) end() {
	t.done = true
	t.releasePending()
	delete(t.d.open, t)
	for k := range t.rows {
		if t.d.locks[k] == t {
			delete(t.d.locks, k)
		}
	}
}

// flush makes every commit durable (the WAL writer, or a synchronous
// commit).
func (d *db) flush() { d.unsynced = d.unsynced[:0] }

// crash is an immediate shutdown and restart: the commits not flushed are
// lost, every open transaction is aborted, every session broken; the
// server answers again after downFor.
func (d *db) crash(downFor time.Duration) {
	for i := len(d.unsynced) - 1; i >= 0; i-- {
		u := d.unsynced[i]
		if u.prev == nil {
			delete(d.cursors, u.key)
		} else {
			d.cursors[u.key] = u.prev
		}
	}
	d.unsynced = d.unsynced[:0]
	for t := range d.open {
		t.end()
	}
	d.crashes++
	d.down = d.now().Add(downFor)
}

// isDown reports whether the server is down.
func (d *db) isDown() bool { return d.now().Before(d.down) }

// appendLog appends msgs to partition p of topic with the next seqs, in
// one committed (synchronous) transaction, and returns the seqs.
func (d *db) appendLog(p tp, msgs []logRow) []int64 {
	rows := d.log[p]
	seqs := make([]int64, len(msgs))
	for i, m := range msgs {
		m.seq = int64(len(rows) + 1)
		seqs[i] = m.seq
		rows = append(rows, m)
	}
	d.log[p] = rows
	d.flush()
	return seqs
}

// lastSeq is the last seq of p (0: none).
func (d *db) lastSeq(p tp) int64 { return int64(len(d.log[p])) }

// sortedCursors returns the keys of the cursor rows of a group and topic,
// by partition.
func (d *db) sortedCursors(group, topic string) []cursorKey {
	var ks []cursorKey
	for k := range d.cursors {
		if k.group == group && k.topic == topic {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].partition < ks[j].partition })
	return ks
}

// sortedMembers returns the member ids of a group and topic, sorted.
func (d *db) sortedMembers(group, topic string) []string {
	var ids []string
	for k := range d.members {
		if k.group == group && k.topic == topic {
			ids = append(ids, k.member)
		}
	}
	slices.Sort(ids)
	return ids
}
