package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgrepl"
	"github.com/millrace/watermill-outbox/internal/relaydriver"
	"github.com/millrace/watermill-outbox/internal/walrecord"
)

// The log-based mode's model: the WAL the publishers' transactions write
// their records into, the schema's logical replication slot (one stream at
// a time, resuming after its confirmed position, ended by the server when
// its holder is silent for wal_sender_timeout), and the tables a relay
// appends to (the relays row, locked by an append's transaction until it
// ends; lock_timeout; pg_terminate_backend of stale append sessions). The
// relay's own code (package relay: streaming, skipping what was appended
// before a restart, confirming, batching, numbering, appending fenced by
// the position, ending stale appenders) runs on it through
// internal/relaydriver.

// walTxn is a transaction committed by a publisher in the log-based mode.
type walTxn struct {
	commit, end pgrepl.LSN
	at          time.Time
	records     [][]byte // walrecord content
}

// wal is the WAL, the slot and the relays row.
type wal struct {
	// mu serializes the model's changes when no scheduler does (the
	// pinning tests run a relay's goroutines freely).
	mu        sync.Mutex
	d         *db
	q         *dbsql.Queries
	prefix    string
	txns      []walTxn
	next      pgrepl.LSN // the next record's LSN
	confirmed pgrepl.LSN // the slot's confirmed_flush_lsn
	active    *walStream // the stream holding the slot
	relayLSN  int64      // relays.lsn (the row exists once a relay made it)
	relayRow  bool
	rowLock   *appendTx // the append transaction holding the relays row
	bodies    map[int64][]byte
	bodyID    int64
	conns     []*appendConn
	// forwardOnly: the topic is forwarder-only (the relays put its
	// messages into the database's pending rows).
	forwardOnly bool
}

func newWAL(d *db, schema string) *wal {
	return &wal{d: d, q: dbsql.For(schema), prefix: names.WALPrefix(schema), next: 100, bodies: map[int64][]byte{}}
}

// locked evaluates f under mu.
func (w *wal) locked(f func() bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return f()
}

// commit writes a publisher's transaction into the WAL.
func (w *wal) commit(msgs []pubMsg) {
	t := walTxn{at: w.d.now()}
	for _, m := range msgs {
		md, _ := json.Marshal(map[string]string{"outbox_partition_key": m.key})
		t.records = append(t.records, walrecord.Append(nil, int32(m.partition), topic, m.key, m.uuid, string(md), m.payload))
		w.next += 16
	}
	t.commit = w.next
	t.end = w.next + 8
	w.next += 24
	w.txns = append(w.txns, t)
}

// appended reports whether every committed transaction is in the log.
func (w *wal) appended() bool {
	return len(w.txns) == 0 || w.relayLSN >= int64(w.txns[len(w.txns)-1].commit)
}

// endAll ends every stream and append session (a server crash).
func (w *wal) endAll() {
	if w.active != nil {
		w.active.ended = true
		w.active = nil
	}
	for _, c := range w.conns {
		c.terminate()
	}
}

// walStream is a replication stream of the slot (relaydriver.Stream).
type walStream struct {
	w             *wal
	p             *proc
	timeout       time.Duration
	next          int // the next transaction to send
	queue         []pgrepl.Event
	lastHeard     time.Time // the holder's last status
	lastKeepalive time.Time
	ended         bool
}

// keepaliveEvery is how often the server sends a keepalive on an idle
// stream (half of wal_sender_timeout asks for a reply).
func (s *walStream) keepaliveEvery() time.Duration { return s.timeout / 4 }

func (s *walStream) Receive(ctx context.Context) (pgrepl.Event, error) {
	now := s.w.d.now
	ready := func() bool {
		return s.ended || ctx.Err() != nil || len(s.queue) > 0 || s.next < len(s.w.txns) || now().Sub(s.lastKeepalive) >= s.keepaliveEvery()
	}
	o := answered
	if s.p != nil {
		o = s.p.enter("stream", "wal.receive", ready)
	} else {
		// Without a scheduler (the pinning tests): wait for it.
		for !s.w.locked(ready) {
			time.Sleep(time.Millisecond)
		}
	}
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	switch {
	case !o.applies():
		return pgrepl.Event{}, errConnection
	case s.ended:
		return pgrepl.Event{}, pgrepl.ErrStreamEnded
	case ctx.Err() != nil:
		return pgrepl.Event{}, ctx.Err()
	}
	if len(s.queue) == 0 && s.next < len(s.w.txns) {
		t := s.w.txns[s.next]
		s.next++
		s.queue = append(s.queue, pgrepl.Event{Begin: &pgrepl.Begin{FinalLSN: t.commit, CommitTime: t.at}})
		for i, r := range t.records {
			s.queue = append(s.queue, pgrepl.Event{Message: &pgrepl.Message{Transactional: true, LSN: t.commit - pgrepl.LSN(16*(len(t.records)-i)), Prefix: s.w.prefix, Content: r}})
		}
		s.queue = append(s.queue, pgrepl.Event{Commit: &pgrepl.Commit{CommitLSN: t.commit, EndLSN: t.end, CommitTime: t.at}})
	}
	if len(s.queue) > 0 {
		ev := s.queue[0]
		s.queue = s.queue[1:]
		return ev, nil
	}
	s.lastKeepalive = now()
	return pgrepl.Event{Keepalive: &pgrepl.Keepalive{WALEnd: s.w.next, ReplyRequested: now().Sub(s.lastHeard) >= s.timeout/2}}, nil
}

func (s *walStream) SendStatus(flushed pgrepl.LSN, _ bool) error {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	if s.ended {
		return pgrepl.ErrStreamEnded
	}
	if flushed > s.w.confirmed {
		s.w.confirmed = flushed
	}
	s.lastHeard = s.w.d.now()
	return nil
}

func (s *walStream) Close(context.Context) error {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	s.end()
	return nil
}

// end ends the stream; the slot is free.
func (s *walStream) end() {
	s.ended = true
	if s.w.active == s {
		s.w.active = nil
	}
}

// walBackend is a relay process's relaydriver.Backend on the model.
type walBackend struct {
	w       *wal
	p       *proc
	streams []*walStream
	conns   []*appendConn
}

// slotBusy is the server's answer to a second stream of the slot.
var slotBusy = &pgconn.PgError{Code: "55006", Message: "replication slot is active"}

func (b *walBackend) Stream(_ context.Context, _, _ string, timeoutMS int64) (relaydriver.Stream, error) {
	var s *walStream
	err := b.run("wal.start_replication", nil, func() error {
		w := b.w
		if w.active != nil {
			return slotBusy
		}
		s = &walStream{w: w, p: b.p, timeout: time.Duration(timeoutMS) * time.Millisecond, lastHeard: w.d.now(), lastKeepalive: w.d.now()}
		// The server resumes after the confirmed position.
		for s.next < len(w.txns) && w.txns[s.next].commit < w.confirmed {
			s.next++
		}
		w.active = s
		b.streams = append(b.streams, s)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (b *walBackend) Conn(_ context.Context, name string, lockTimeoutMS, _ int64) (relaydriver.Conn, error) {
	var c *appendConn
	err := b.run("wal.connect", nil, func() error {
		c = &appendConn{b: b, name: name, lockTimeout: time.Duration(lockTimeoutMS) * time.Millisecond}
		b.conns = append(b.conns, c)
		b.w.conns = append(b.w.conns, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (b *walBackend) EndStaleAppenders(_ context.Context, name string) (int64, error) {
	var n int64
	err := b.run("wal.end_stale_appenders", nil, func() error {
		for _, c := range b.w.conns {
			if c.name == name && !c.terminated && c.tx != nil {
				c.terminate()
				n++
			}
		}
		return nil
	})
	return n, err
}

// run parks the relay's appending goroutine at op and applies it.
func (b *walBackend) run(op string, ready func() bool, apply func() error) error {
	o := answered
	if b.p != nil {
		o = b.p.enter("db", op, ready)
	} else if ready != nil {
		for !b.w.locked(ready) {
			time.Sleep(time.Millisecond)
		}
	}
	b.w.mu.Lock()
	defer b.w.mu.Unlock()
	if !o.applies() {
		return errConnection
	}
	if b.w.d.isDown() {
		return fmt.Errorf("%w: the server is down", errConnection)
	}
	err := apply()
	if o.fails() {
		return errConnection
	}
	return err
}

// die ends the process's streams and sessions (it was killed).
func (b *walBackend) die() {
	for _, s := range b.streams {
		s.end()
	}
	for _, c := range b.conns {
		c.terminate()
	}
}

// appendConn is a relay's append connection on the model: the statements
// of relay/session.go, recognised by their text (internal/dbsql).
type appendConn struct {
	b           *walBackend
	name        string
	lockTimeout time.Duration
	tx          *appendTx
	terminated  bool
	waitingFrom time.Time // when the statement under way began to wait for the relays row
}

var _ relaydriver.Conn = (*appendConn)(nil)

// terminate ends the session: its transaction rolls back.
func (c *appendConn) terminate() {
	c.terminated = true
	if c.tx != nil {
		c.tx.end()
	}
}

// lockTimeoutErr is PostgreSQL's lock_not_available.
var lockTimeoutErr = &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}

// statement runs a statement that takes the relays row's lock (held until
// tx ends when tx is not nil): it waits for the lock at most lockTimeout.
func (c *appendConn) statement(op string, tx *appendTx, apply func() error) error {
	w := c.b.w
	c.waitingFrom = w.d.now()
	ready := func() bool {
		return w.rowLock == nil || w.rowLock == tx || w.rowLock.conn.terminated || w.d.now().Sub(c.waitingFrom) >= c.lockTimeout
	}
	return c.b.run(op, ready, func() error {
		if c.terminated {
			return errConnection
		}
		if w.rowLock != nil && w.rowLock != tx && !w.rowLock.conn.terminated {
			return lockTimeoutErr
		}
		if tx != nil {
			w.rowLock = tx
		}
		return apply()
	})
}

func (c *appendConn) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	w := c.b.w
	if sql != w.q.WALRelayInit {
		return pgconn.CommandTag{}, fmt.Errorf("sim: the append connection's Exec of an unknown statement: %w", errNotSimulated)
	}
	err := c.statement("wal.relay_init", nil, func() error {
		w.relayRow = true
		return nil
	})
	return pgconn.NewCommandTag("INSERT 0 1"), err
}

func (c *appendConn) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	w := c.b.w
	switch sql {
	case w.q.WALRelayPosition:
		var lsn int64
		err := c.b.run("wal.relay_position", nil, func() error {
			if c.terminated {
				return errConnection
			}
			if !w.relayRow {
				return pgx.ErrNoRows
			}
			lsn = w.relayLSN
			return nil
		})
		return &fakeRow{vals: []any{lsn}, err: err}
	case w.q.WALAppendSmall:
		var moved, appended int64
		err := c.statement("wal.append_small", nil, func() error {
			if w.forwardOnly {
				// The log refuses a forwarder-only topic's partitions,
				// failing the statement as for unregistered ones.
				return &pgconn.PgError{Code: "22P02", Message: `invalid input syntax for type bigint: "relay: topic partitions not registered: ` + topic + ` partition 0"`}
			}
			if w.relayLSN != args[1].(int64) {
				return nil
			}
			moved = 1
			w.relayLSN = args[2].(int64)
			topics, parts := args[3].([]string), args[4].([]int32)
			keys, uuids, payloads := args[5].([]*string), args[6].([]string), args[8].([][]byte)
			byPart := map[int][]logRow{}
			var order []int
			for i := range topics {
				p := int(parts[i])
				if byPart[p] == nil {
					order = append(order, p)
				}
				key := ""
				if keys[i] != nil {
					key = *keys[i]
				}
				byPart[p] = append(byPart[p], logRow{uuid: uuids[i], key: key, payload: payloads[i], poison: len(payloads[i]) >= poisonBytes,
					metadata: map[string]string{"outbox_partition_key": key}})
			}
			for _, p := range order {
				w.d.appendLog(tp{topic, p}, byPart[p])
				appended += int64(len(byPart[p]))
			}
			return nil
		})
		return &fakeRow{vals: []any{moved, appended, (*int64)(nil), (*int64)(nil)}, err: err}
	case w.q.WALAppendPending:
		var moved, inserted int64
		err := c.statement("wal.append_pending", nil, func() error {
			if w.relayLSN != args[1].(int64) {
				return nil
			}
			moved = 1
			w.relayLSN = args[2].(int64)
			topics, parts, keys := args[3].([]string), args[4].([]int32), args[5].([]string)
			uuids, payloads := args[6].([]string), args[8].([][]byte)
			rows := make([]pendingRow, len(topics))
			for i := range topics {
				if topics[i] != topic || !w.forwardOnly {
					return fmt.Errorf("sim: a message of %q put into pending (only a forwarder-only topic's are): %w", topics[i], errNotSimulated)
				}
				rows[i] = pendingRow{partition: int(parts[i]), uuid: uuids[i], key: keys[i], payload: payloads[i], poison: len(payloads[i]) >= poisonBytes}
			}
			w.d.commitPending(w.d.insertPending(rows))
			inserted = int64(len(rows))
			return nil
		})
		return &fakeRow{vals: []any{moved, inserted, (*int64)(nil)}, err: err}
	}
	return &fakeRow{err: fmt.Errorf("sim: the append connection's QueryRow of an unknown statement: %w", errNotSimulated)}
}

func (c *appendConn) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	w := c.b.w
	switch sql {
	case w.q.PendingHeldKeys:
		err := c.b.run("wal.held_keys", nil, func() error {
			if c.terminated {
				return errConnection
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		return &fakeRows{}, nil // no delayed messages in the simulation
	case w.q.TopicsForwardOnlyNames:
		err := c.b.run("wal.forward_only_topics", nil, func() error {
			if c.terminated {
				return errConnection
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		rows := &fakeRows{}
		if w.forwardOnly {
			rows.rows = append(rows.rows, []any{topic})
		}
		return rows, nil
	}
	return nil, fmt.Errorf("sim: the append connection's Query of an unknown statement: %w", errNotSimulated)
}

func (c *appendConn) Begin(context.Context) (pgx.Tx, error) {
	var t *appendTx
	err := c.b.run("wal.begin", nil, func() error {
		if c.terminated {
			return errConnection
		}
		t = &appendTx{conn: c}
		c.tx = t
		return nil
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

func (c *appendConn) Close(context.Context) error {
	c.terminate()
	return nil
}
