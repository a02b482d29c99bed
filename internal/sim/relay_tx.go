package sim

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// appendTx is an append's transaction: what it stages is applied at
// commit; it holds the relays row from WALAdvance until it ends.
type appendTx struct {
	conn   *appendConn
	newLSN int64
	moved  bool
	counts map[int]int64
	rows   []logRow
	seqs   []tp // the partition of each staged row
	done   bool
}

var _ pgx.Tx = (*appendTx)(nil)

func (t *appendTx) end() {
	t.done = true
	w := t.conn.b.w
	if w.rowLock == t {
		w.rowLock = nil
	}
	if t.conn.tx == t {
		t.conn.tx = nil
	}
}

func (t *appendTx) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	w := t.conn.b.w
	if sql != w.q.WALAdvance {
		return &fakeRow{err: fmt.Errorf("sim: an append transaction's QueryRow of an unknown statement: %w", errNotSimulated)}
	}
	var moved int64
	var gotTopics []string
	var gotParts []int32
	var bases []int64
	err := t.conn.statement("wal.advance", t, func() error {
		if t.done {
			return errConnection
		}
		if w.relayLSN != args[1].(int64) {
			return nil
		}
		moved, t.moved, t.newLSN = 1, true, args[2].(int64)
		topics, parts, ns := args[3].([]string), args[4].([]int32), args[5].([]int64)
		t.counts = map[int]int64{}
		for i := range topics {
			if w.forwardOnly {
				continue // refused, as an unregistered partition is: missing from the answer
			}
			p := int(parts[i])
			gotTopics, gotParts = append(gotTopics, topics[i]), append(gotParts, parts[i])
			bases = append(bases, w.d.lastSeq(tp{topic, p}))
			t.counts[p] = ns[i]
		}
		return nil
	})
	return &fakeRow{vals: []any{moved, gotTopics, gotParts, bases, (*int64)(nil)}, err: err}
}

func (t *appendTx) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	w := t.conn.b.w
	if sql != w.q.BodiesNextIDs {
		return nil, fmt.Errorf("sim: an append transaction's Query of an unknown statement: %w", errNotSimulated)
	}
	var ids []any
	err := t.conn.b.run("wal.bodies_next_ids", nil, func() error {
		if t.done || t.conn.terminated {
			return errConnection
		}
		for range toInt(args[0]) {
			w.bodyID++
			ids = append(ids, w.bodyID)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rows := &fakeRows{}
	for _, id := range ids {
		rows.rows = append(rows.rows, []any{id})
	}
	return rows, nil
}

func (t *appendTx) CopyFrom(_ context.Context, table pgx.Identifier, _ []string, src pgx.CopyFromSource) (int64, error) {
	w := t.conn.b.w
	var n int64
	err := t.conn.b.run("wal.copy_"+table[len(table)-1], nil, func() error {
		if t.done || t.conn.terminated {
			return errConnection
		}
		for src.Next() {
			v, err := src.Values()
			if err != nil {
				return err
			}
			n++
			switch table[len(table)-1] {
			case "bodies":
				w.bodies[v[0].(int64)] = v[1].([]byte)
			case "log":
				// topic, partition, seq, key, uuid, metadata, payload, body_id, created_at
				payload, _ := v[6].([]byte)
				if id, ok := v[7].(*int64); ok && id != nil {
					payload = w.bodies[*id]
				}
				key := ""
				if k, ok := v[3].(*string); ok && k != nil {
					key = *k
				}
				t.rows = append(t.rows, logRow{seq: v[2].(int64), uuid: v[4].(string), key: key, payload: payload,
					poison: len(payload) >= poisonBytes, metadata: map[string]string{"outbox_partition_key": key}})
				t.seqs = append(t.seqs, tp{v[0].(string), int(v[1].(int32))})
			default:
				return fmt.Errorf("sim: copy into %v: %w", table, errNotSimulated)
			}
		}
		return src.Err()
	})
	return n, err
}

func (t *appendTx) Commit(context.Context) error {
	w := t.conn.b.w
	err := t.conn.b.run("wal.commit", nil, func() error {
		if t.done || t.conn.terminated {
			return errConnection
		}
		// The rows go in whether the relays row moved or not, as COPY put
		// them in (the relay checks that it moved before it copies).
		if t.moved {
			w.relayLSN = t.newLSN
		}
		{
			byPart := map[tp][]logRow{}
			var order []tp
			for i, r := range t.rows {
				k := t.seqs[i]
				if byPart[k] == nil {
					order = append(order, k)
				}
				byPart[k] = append(byPart[k], r)
			}
			for _, k := range order {
				rows := byPart[k]
				if rows[0].seq != w.d.lastSeq(k)+1 {
					// PostgreSQL: a duplicate key (23505) or a gap.
					return &pgconn.PgError{Code: "23505", Message: fmt.Sprintf("sim: the append numbers partition %d from %d, the log ends at %d", k.partition, rows[0].seq, w.d.lastSeq(k))}
				}
				w.d.appendLog(k, rows)
			}
		}
		return nil
	})
	t.end()
	return err
}

func (t *appendTx) Rollback(context.Context) error {
	t.end()
	return nil
}

func (t *appendTx) Begin(context.Context) (pgx.Tx, error) { return nil, errNotSimulated }
func (t *appendTx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	return nil
}
func (t *appendTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }
func (t *appendTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, errNotSimulated
}
func (t *appendTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNotSimulated
}
func (t *appendTx) Conn() *pgx.Conn { return nil }
