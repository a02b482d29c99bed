package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/lease"
)

// conn is a process's sessions with the database model: it implements
// lease.Store and consumer.Store with the semantics of internal/dbsql's
// statements. Every statement parks the process (see proc.enter); the
// scheduler decides when it runs and how it ends.
type conn struct {
	d     *db
	p     *proc
	group string
	txs   map[*simTx]bool // open transactions of the process
}

var (
	_ lease.Store    = (*conn)(nil)
	_ consumer.Store = (*conn)(nil)
)

// errNotSimulated: a statement the forwarding path never runs (key
// isolation, the Transactional strategy's savepoints).
var errNotSimulated = errors.New("sim: not simulated")

// run parks the process at statement op (ready: when it can go on, nil:
// at once) and then applies it, unless the scheduler failed it first; a
// statement whose answer is lost took effect and fails.
func (c *conn) run(role, op string, ready func() bool, apply func() error) error {
	o := answered
	if c.p != nil {
		o = c.p.enter(role, op, ready)
	}
	if !o.applies() {
		return errConnection
	}
	if c.d.isDown() {
		return fmt.Errorf("%w: the server is down", errConnection)
	}
	err := apply()
	if o.fails() {
		return errConnection
	}
	return err
}

// detail is the op with details when the schedule is traced.
func (c *conn) detail(op, format string, args ...any) string {
	if c.p == nil {
		return op
	}
	return c.p.s.detail(op, format, args...)
}

// free reports a ready func: k is not locked by another transaction.
func (c *conn) free(tx *dbTx, k cursorKey) func() bool {
	return func() bool { return !c.d.lockedFor(tx, k) }
}

// abortAll aborts the process's open transactions: its connections are
// gone.
func (c *conn) abortAll() {
	for t := range c.txs {
		t.tx.rollback()
		delete(c.txs, t)
	}
}

func (c *conn) key(g lease.Group, p int) cursorKey {
	return cursorKey{group: g.Name, topic: g.Topic, partition: p}
}

// lease.Store

func (c *conn) CreateCursors(ctx context.Context, g lease.Group, partitions int, fromNewest bool) error {
	return c.run(roleOf(ctx, "db"), "db.create_cursors", nil, func() error {
		for p := range partitions {
			k := c.key(g, p)
			if c.d.cursors[k] != nil {
				continue
			}
			r := &cursorRow{}
			if fromNewest {
				r.seq = c.d.lastSeq(tp{g.Topic, p})
			}
			c.d.cursors[k] = r
		}
		c.d.flush()
		return nil
	})
}

func (c *conn) ExpireMembers(ctx context.Context, g lease.Group, deadFor time.Duration) error {
	return c.run(roleOf(ctx, "db"), "db.expire_members", nil, func() error {
		now := c.d.now()
		for k, m := range c.d.members {
			if k.group == g.Name && k.topic == g.Topic && m.heartbeat.Add(m.ttl).Before(now.Add(-deadFor)) {
				delete(c.d.members, k)
			}
		}
		c.d.flush()
		return nil
	})
}

func (c *conn) Balance(ctx context.Context, g lease.Group, member string, ttl time.Duration, partitions int) (lease.Balance, error) {
	var b lease.Balance
	err := c.run(roleOf(ctx, "db"), "db.balance", nil, func() error {
		now := c.d.now()
		c.d.members[memberKey{g.Name, g.Topic, member}] = &memberRow{heartbeat: now, ttl: ttl}
		for _, id := range c.d.sortedMembers(g.Name, g.Topic) {
			m := c.d.members[memberKey{g.Name, g.Topic, id}]
			if id != member && m.heartbeat.Add(m.ttl).After(now) {
				b.Others = append(b.Others, id)
				if in := m.heartbeat.Add(m.ttl).Sub(now); b.OthersExpireIn == 0 || in < b.OthersExpireIn {
					b.OthersExpireIn = in
				}
			}
		}
		for _, k := range c.d.sortedCursors(g.Name, g.Topic) {
			r := c.d.cursors[k]
			if k.partition < partitions && !r.paused {
				b.Active++
			}
			if r.paused && r.owner == member {
				b.Paused = append(b.Paused, int32(k.partition))
			}
		}
		c.d.flush()
		return nil
	})
	return b, err
}

// lifespan returns when a lease taken or renewed now for ttl expires.
func (c *conn) lifespan(ttl time.Duration) time.Time { return c.d.now().Add(ttl) }

func (c *conn) Acquire(ctx context.Context, g lease.Group, member string, partitions int, exclude []int32, ttl time.Duration, n int) ([]lease.Acquired, error) {
	var got []lease.Acquired
	err := c.run(roleOf(ctx, "db"), c.detail("db.acquire", "%d, not %v", n, sortedInt32(exclude)), nil, func() error {
		now := c.d.now()
		type cand struct {
			k    cursorKey
			hash int32
		}
		var cands []cand
		for _, k := range c.d.sortedCursors(g.Name, g.Topic) {
			r := c.d.cursors[k]
			if k.partition >= partitions || r.paused || c.d.lockedFor(nil, k) {
				continue
			}
			if r.owner != "" && !r.expires.IsZero() && r.expires.After(now) {
				continue
			}
			if containsInt32(exclude, int32(k.partition)) {
				continue
			}
			cands = append(cands, cand{k, hashText(fmt.Sprintf("%s:%d", member, k.partition))})
		}
		// ORDER BY hashtext(member || ':' || partition), partition
		sortStable(cands, func(a, b cand) bool {
			if a.hash != b.hash {
				return a.hash < b.hash
			}
			return a.k.partition < b.k.partition
		})
		if len(cands) > n {
			cands = cands[:n]
		}
		for _, cd := range cands {
			old := *c.d.cursors[cd.k]
			solo := old.inflightTo > old.seq && old.inflightSolo && old.inflightFrom == old.seq+1 && old.inflightTo == old.seq+1
			unexplained := old.inflightTo > old.seq && !(old.inflightSolo && old.inflightFrom == old.seq+1 && old.inflightTo == old.seq+1)
			r := old
			r.owner, r.token, r.expires = member, old.token+1, c.lifespan(ttl)
			if solo {
				r.attempts = min(old.attempts+1+old.unexplained, 2147483646)
				r.unexplained = 0
			} else if unexplained && old.seq+1 >= old.inflightFrom && old.seq+1 <= old.inflightTo {
				r.unexplained = old.unexplained + 1
			}
			if unexplained {
				if old.suspectTo > old.seq {
					r.suspectFrom = min(old.suspectFrom, max(old.inflightFrom, old.seq+1))
				} else {
					r.suspectFrom = max(old.inflightFrom, old.seq+1)
				}
				r.suspectTo = max(old.suspectTo, old.inflightTo)
			}
			r.inflightFrom, r.inflightTo, r.inflightSolo = 0, 0, false
			switch {
			case solo:
				r.lastError = fmt.Sprintf("seq %d: the consumer process died while this message was the only delivery in flight in it (delivery %d)", old.seq+1, old.deliveries)
			case unexplained && old.lastError == "":
				r.lastError = fmt.Sprintf("seq %d..%d: the consumer process died with other deliveries in flight: nobody is charged; these messages are delivered alone until the one that crashes it is found", old.inflightFrom, old.inflightTo)
			}
			c.d.cursors[cd.k] = &r
			a := lease.Acquired{
				Partition: int32(cd.k.partition), Token: r.token, Cursor: r.seq, Attempts: int32(r.attempts),
				Charged: int32(r.attempts - old.attempts), LastError: r.lastError, Unexplained: unexplained,
			}
			if !r.backoffUntil.IsZero() && r.backoffUntil.After(now) {
				a.Backoff = r.backoffUntil.Sub(now)
			}
			if r.suspectTo > r.seq {
				a.SuspectFrom, a.SuspectTo = r.suspectFrom, r.suspectTo
			}
			got = append(got, a)
		}
		c.d.flush()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return got, nil
}

func (c *conn) Renew(ctx context.Context, g lease.Group, member string, parts []int32, tokens []int64, ttl time.Duration) (map[int32]bool, error) {
	out := map[int32]bool{}
	err := c.run(roleOf(ctx, "db"), "db.renew", nil, func() error {
		now := c.d.now()
		for i, p := range parts {
			k := c.key(g, int(p))
			r := c.d.cursors[k]
			if r == nil || r.owner != member || r.token != tokens[i] || r.expires.IsZero() || !r.expires.After(now) {
				continue
			}
			if c.d.lockedFor(nil, k) {
				out[p] = false
				continue
			}
			nr := *r
			nr.expires = c.lifespan(ttl)
			c.d.cursors[k] = &nr
			out[p] = true
		}
		c.d.flush()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *conn) Release(ctx context.Context, g lease.Group, member string, parts []int32, tokens []int64) ([]int32, error) {
	var out []int32
	err := c.run(roleOf(ctx, "db"), "db.release", nil, func() error {
		for i, p := range parts {
			k := c.key(g, int(p))
			r := c.d.cursors[k]
			if r == nil || r.owner != member || r.token != tokens[i] || c.d.lockedFor(nil, k) {
				continue
			}
			nr := *r
			nr.owner, nr.expires = "", time.Time{}
			c.d.cursors[k] = &nr
			out = append(out, p)
		}
		c.d.flush()
		return nil
	})
	return out, err
}

func (c *conn) StillHeld(ctx context.Context, g lease.Group, member string, parts []int32, tokens []int64) ([]int32, error) {
	var out []int32
	err := c.run(roleOf(ctx, "db"), "db.still_held", nil, func() error {
		now := c.d.now()
		for i, p := range parts {
			r := c.d.cursors[c.key(g, int(p))]
			if r != nil && r.owner == member && r.token == tokens[i] && !r.expires.IsZero() && r.expires.After(now) {
				out = append(out, p)
			}
		}
		return nil
	})
	return out, err
}

func (c *conn) Leave(ctx context.Context, g lease.Group, member string) error {
	return c.run(roleOf(ctx, "db"), "db.leave", nil, func() error {
		delete(c.d.members, memberKey{g.Name, g.Topic, member})
		c.d.flush()
		return nil
	})
}

// holds reports whether row r is fenced to f and unexpired.
func (c *conn) holds(r *cursorRow, f lease.Fence) bool {
	return r != nil && r.owner == f.Member && r.token == f.Token && !r.expires.IsZero() && r.expires.After(c.d.now())
}

func (c *conn) Advance(ctx context.Context, tx pgx.Tx, relaxed bool, f lease.Fence, seq int64) (bool, error) {
	t, err := c.tx(tx)
	if err != nil {
		return false, err
	}
	k := c.key(f.Group, f.Partition)
	ok := false
	err = c.in(ctx, t, c.detail("db.advance", "p%d to %d (token %d, tx %v, relaxed %v)", f.Partition, seq, f.Token, t != nil, relaxed), c.free(t.dbTx(), k), func() error {
		r := c.d.cursor(t.dbTx(), k)
		if !c.holds(r, f) || r.seq >= seq {
			return nil
		}
		ok = true
		c.d.write(t.dbTx(), k, relaxed, func(r *cursorRow) {
			suspect := seq+1 >= r.suspectFrom && seq+1 <= r.suspectTo
			r.seq, r.attempts = seq, 0
			r.unexplained, r.deliveries = 0, 0
			if suspect {
				r.unexplained, r.deliveries = 1, 1
			}
			if seq >= r.suspectTo {
				r.suspectFrom, r.suspectTo = 0, 0
			}
			r.inflightFrom, r.inflightTo, r.inflightSolo = 0, 0, false
			r.backoffUntil, r.lastError = time.Time{}, ""
		})
		return nil
	})
	return ok, err
}

func (c *conn) Writer(ctx context.Context, f lease.Fence) (writer string, known, held bool, err error) {
	k := c.key(f.Group, f.Partition)
	err = c.run(roleOf(ctx, "db"), c.detail("db.writer", "p%d (token %d)", f.Partition, f.Token), nil, func() error {
		r := c.d.cursors[k]
		if !c.holds(r, f) {
			return nil
		}
		writer, known, held = r.writer, !r.writerNull, true
		return nil
	})
	if err != nil {
		return "", false, false, err
	}
	return writer, known, held, nil
}

func (c *conn) SetWriter(ctx context.Context, f lease.Fence, writer string) (bool, error) {
	k := c.key(f.Group, f.Partition)
	ok := false
	err := c.run(roleOf(ctx, "db"), c.detail("db.set_writer", "p%d %s (token %d)", f.Partition, writer, f.Token), c.free(nil, k), func() error {
		if !c.holds(c.d.cursors[k], f) {
			return nil
		}
		ok = true
		c.d.write(nil, k, false, func(r *cursorRow) { r.writer, r.writerNull = writer, false })
		return nil
	})
	return ok, err
}

func (c *conn) Retry(ctx context.Context, tx pgx.Tx, f lease.Fence, text string, retryIn time.Duration) (bool, error) {
	t, err := c.tx(tx)
	if err != nil {
		return false, err
	}
	k := c.key(f.Group, f.Partition)
	ok := false
	err = c.in(ctx, t, c.detail("db.retry", "p%d (token %d) in %v: %s", f.Partition, f.Token, retryIn, text), c.free(t.dbTx(), k), func() error {
		if !c.holds(c.d.cursor(t.dbTx(), k), f) {
			return nil
		}
		ok = true
		now := c.d.now()
		c.d.write(t.dbTx(), k, false, func(r *cursorRow) {
			r.attempts = min(r.attempts, 2147483646) + 1
			r.lastError, r.backoffUntil = text, now.Add(retryIn)
			r.inflightFrom, r.inflightTo, r.inflightSolo = 0, 0, false
		})
		return nil
	})
	return ok, err
}

func (c *conn) UndoDelivery(ctx context.Context, f lease.Fence, cursor int64) error {
	k := c.key(f.Group, f.Partition)
	return c.run(roleOf(ctx, "db"), "db.undo_delivery", c.free(nil, k), func() error {
		r := c.d.cursors[k]
		if !c.holds(r, f) || r.seq != cursor || r.inflightTo <= r.seq {
			return nil
		}
		c.d.write(nil, k, false, func(r *cursorRow) {
			r.deliveries = max(r.deliveries-1, r.attempts+r.unexplained)
			r.inflightFrom, r.inflightTo, r.inflightSolo = 0, 0, false
		})
		return nil
	})
}

func (c *conn) Inspect(ctx context.Context, tx pgx.Tx, g lease.Group, p int) (lease.Inspection, bool, error) {
	t, err := c.tx(tx)
	if err != nil {
		return lease.Inspection{}, false, err
	}
	var in lease.Inspection
	found := false
	err = c.in(ctx, t, "db.inspect", nil, func() error {
		r := c.d.cursor(t.dbTx(), c.key(g, p))
		if r == nil {
			return nil
		}
		found = true
		in = lease.Inspection{Cursor: r.seq, Owner: r.owner, Token: r.token, Live: !r.expires.IsZero() && r.expires.After(c.d.now())}
		return nil
	})
	return in, found, err
}

// consumer.Store

func (c *conn) Read(ctx context.Context, topic string, partition int, cursor int64, limit int, fence consumer.Lease, wholeBatch, solo bool) ([]consumer.Entry, *int32, error) {
	k := cursorKey{c.group, topic, partition}
	var ready func() bool
	if fence != nil {
		ready = c.free(nil, k)
	}
	var out []consumer.Entry
	var counted *int32
	err := c.run(roleOf(ctx, "db"), c.detail("db.read", "p%d after %d limit %d", partition, cursor, limit), ready, func() error {
		rows := c.d.log[tp{topic, partition}]
		for i := cursor; i < int64(len(rows)) && len(out) < limit; i++ {
			if i < 0 {
				continue
			}
			out = append(out, entryOf(rows[i]))
		}
		if fence == nil || len(out) == 0 || out[0].Seq != cursor+1 {
			return nil
		}
		r := c.d.cursors[k]
		f := lease.Fence{Group: lease.Group{Name: c.group, Topic: topic}, Partition: partition, Member: fence.Owner(), Token: fence.Token()}
		if r == nil || r.seq != cursor || !c.holds(r, f) {
			return nil
		}
		var n int64
		c.d.write(nil, k, true, func(r *cursorRow) {
			r.deliveries = max(r.deliveries, r.attempts) + 1
			r.inflightFrom, r.inflightTo, r.inflightSolo = cursor+1, cursor+1, solo
			if wholeBatch {
				r.inflightTo = out[len(out)-1].Seq
			}
			n = r.deliveries
		})
		n32 := int32(n)
		counted = &n32
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, counted, nil
}

// entryOf is a log row as the store returns it.
func entryOf(r logRow) consumer.Entry {
	md := make(map[string]string, len(r.metadata))
	for k, v := range r.metadata {
		md[k] = v
	}
	return consumer.Entry{Seq: r.seq, UUID: r.uuid, Key: r.key, Metadata: md, Payload: r.payload}
}

func (c *conn) ReadSeqs(context.Context, string, int, []int64) ([]consumer.Entry, error) {
	return nil, errNotSimulated
}

func (c *conn) Begin(ctx context.Context) (pgx.Tx, error) {
	t, err := c.begin(ctx)
	if err != nil {
		return nil, err
	}
	return t, nil
}

func (c *conn) begin(ctx context.Context) (*simTx, error) {
	var t *simTx
	role := roleOf(ctx, "db")
	err := c.run(role, "db.begin", nil, func() error {
		t = &simTx{c: c, tx: c.d.begin(), role: role}
		c.txs[t] = true
		return nil
	})
	if err != nil && t != nil {
		t.tx.rollback()
		delete(c.txs, t)
	}
	return t, err
}

func (c *conn) InTx(ctx context.Context, _ bool, fn func(pgx.Tx) error) error {
	t, err := c.begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(t); err != nil {
		_ = t.Rollback(ctx)
		return err
	}
	return t.Commit(ctx)
}

func (c *conn) Savepoint(context.Context, pgx.Tx, consumer.SavepointOp) error { return errNotSimulated }

func (c *conn) SaveAdaptive(ctx context.Context, topic string, partition int, token int64, state string, _ int) error {
	k := cursorKey{c.group, topic, partition}
	return c.run(roleOf(ctx, "db"), "db.save_adaptive", c.free(nil, k), func() error {
		if r := c.d.cursors[k]; r != nil && r.token == token {
			c.d.write(nil, k, false, func(r *cursorRow) { r.adaptive = state })
		}
		return nil
	})
}

func (c *conn) MarkInFlight(ctx context.Context, topic string, l consumer.Lease, seq int64) (bool, error) {
	k := cursorKey{c.group, topic, l.Partition()}
	ok := false
	err := c.run(roleOf(ctx, "db"), "db.mark_in_flight", c.free(nil, k), func() error {
		r := c.d.cursors[k]
		f := lease.Fence{Group: lease.Group{Name: c.group, Topic: topic}, Partition: l.Partition(), Member: l.Owner(), Token: l.Token()}
		if !c.holds(r, f) || r.seq >= seq {
			return nil
		}
		ok = true
		c.d.write(nil, k, true, func(r *cursorRow) { r.inflightFrom, r.inflightTo, r.inflightSolo = seq, seq, false })
		return nil
	})
	return ok, err
}

func (c *conn) HeldAdopt(context.Context, string, consumer.Lease) error { return errNotSimulated }
func (c *conn) HeldLoad(context.Context, string, int) ([]consumer.HeldRow, error) {
	return nil, errNotSimulated
}
func (c *conn) HeldInsert(context.Context, pgx.Tx, string, int, []consumer.Hold) error {
	return errNotSimulated
}
func (c *conn) HeldCount(context.Context, string, consumer.Lease, int64, bool) (int, bool, error) {
	return 0, false, errNotSimulated
}
func (c *conn) HeldUndoCount(context.Context, string, consumer.Lease, int64) error {
	return errNotSimulated
}
func (c *conn) HeldRetry(context.Context, string, consumer.Lease, int64, string, time.Duration) (bool, error) {
	return false, errNotSimulated
}
func (c *conn) HeldRelease(context.Context, pgx.Tx, string, consumer.Lease, []int64) (int, error) {
	return 0, errNotSimulated
}
func (c *conn) HeldShowFull(context.Context, string, consumer.Lease, bool) error {
	return errNotSimulated
}

// in runs a statement in t (nil: a statement of its own).
func (c *conn) in(ctx context.Context, t *simTx, op string, ready func() bool, apply func() error) error {
	if t == nil {
		return c.run(roleOf(ctx, "db"), op, ready, apply)
	}
	if t.tx.done {
		return errors.New("sim: statement in an ended transaction")
	}
	return c.run(t.role, op, ready, func() error {
		if t.tx.crashes != c.d.crashes {
			return errConnection
		}
		return apply()
	})
}

// tx returns the model transaction of tx (nil: none).
func (c *conn) tx(tx pgx.Tx) (*simTx, error) {
	if tx == nil {
		return nil, nil
	}
	t, ok := tx.(*simTx)
	if !ok {
		return nil, fmt.Errorf("sim: a %T is not a transaction of the model", tx)
	}
	return t, nil
}

// simTx is a transaction of the model as pgx.Tx: the forwarding path
// runs the statements of lease.Store and the RejectHandler in it, nothing
// else.
type simTx struct {
	c    *conn
	tx   *dbTx
	role string // of the goroutine that began it
}

var _ pgx.Tx = (*simTx)(nil)

func (t *simTx) dbTx() *dbTx {
	if t == nil {
		return nil
	}
	return t.tx
}

// deadLetter stores m as rejected in the transaction (the sim's
// RejectHandler).
func (t *simTx) deadLetter(m deadLetter) error {
	return t.c.in(context.Background(), t, "db.dead_letter", nil, func() error {
		t.tx.dead = append(t.tx.dead, m)
		return nil
	})
}

func (t *simTx) Commit(context.Context) error {
	defer delete(t.c.txs, t)
	err := t.c.run(t.role, "db.commit", nil, func() error { return t.tx.commit() })
	// A commit that did not take effect ends the transaction too: its
	// connection broke, and the server rolled it back.
	t.tx.rollback()
	return err
}

func (t *simTx) Rollback(context.Context) error {
	t.tx.rollback()
	delete(t.c.txs, t)
	return nil
}

func (t *simTx) Begin(context.Context) (pgx.Tx, error) { return nil, errNotSimulated }
func (t *simTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errNotSimulated
}
func (t *simTx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults { return nil }
func (t *simTx) LargeObjects() pgx.LargeObjects                         { return pgx.LargeObjects{} }
func (t *simTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, errNotSimulated
}
func (t *simTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNotSimulated
}
func (t *simTx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errNotSimulated
}
func (t *simTx) QueryRow(context.Context, string, ...any) pgx.Row { return errRow{} }
func (t *simTx) Conn() *pgx.Conn                                  { return nil }

type errRow struct{}

func (errRow) Scan(...any) error { return errNotSimulated }

// sortedInt32 returns a sorted copy of xs (the real code passes some
// lists in map order).
func sortedInt32(xs []int32) []int32 {
	out := append([]int32(nil), xs...)
	slices.Sort(out)
	return out
}
