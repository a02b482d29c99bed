package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/pgcombine"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
)

// PGStore is the Store on PostgreSQL: the statements of internal/dbsql
// (log.sql, transaction.sql, held.sql, cursors.sql) for one consumer group.
type PGStore struct {
	pool *pgxpool.Pool
	db   pgexec.DB
	// relaxed runs the counted reads (and, through the lease manager, the
	// relaxed cursor moves): the workers a sequencer pass wakes together
	// share round trips (internal/pgcombine).
	relaxed *pgcombine.Combiner
	q       *dbsql.Queries
	schema  string
	group   string
	marker  *Marker
}

var _ Store = (*PGStore)(nil)

// NewStore returns the store of consumer group on the outbox in schema.
// Its Marker's goroutine, started on first use, is one of tasks (started
// before the store is used, stopped after).
func NewStore(pool *pgxpool.Pool, schema, group string, tasks *Tasks) *PGStore {
	db, _ := pgexec.FromDB(pool) // a *pgxpool.Pool always adapts
	q := dbsql.For(schema)
	relaxed := pgcombine.New(pool)
	// The counted reads and the cursor moves of the partitions that step
	// together (woken by one sequencer pass) go in one statement each.
	relaxed.Merge(q.LogReadCounting, pgcombine.Merge{Many: q.LogReadCountingMany, Args: mergeReads, Key: partitionKey(1, 2)})
	relaxed.Merge(q.CursorsAdvanceRelaxed, pgcombine.Merge{Many: q.CursorsAdvanceRelaxedMany, Args: mergeAdvances, Key: partitionKey(1, 2)})
	return &PGStore{pool: pool, db: db, relaxed: relaxed, q: q, schema: schema, group: group,
		marker: newMarker(pool, schema, group, tasks)}
}

// partitionKey is a pgcombine.Merge's Key: the topic and the partition at
// args[topic] and args[partition].
func partitionKey(topic, partition int) func(args []any) string {
	return func(args []any) string {
		if len(args) <= max(topic, partition) {
			return ""
		}
		return fmt.Sprintf("%v\x00%v", args[topic], args[partition])
	}
}

// mergeReads is LogReadCountingMany's arguments for LogReadCounting's
// calls (Read's arguments): the group, then one array per parameter.
func mergeReads(calls [][]any) ([]any, error) {
	n := len(calls)
	var group string
	topics, parts, cursors, owners, tokens, limits, whole, solo :=
		make([]string, n), make([]int32, n), make([]int64, n), make([]string, n), make([]int64, n), make([]int32, n), make([]bool, n), make([]bool, n)
	for i, a := range calls {
		var ok [9]bool
		var g string
		var part, limit int
		if len(a) == 9 {
			g, ok[0] = a[0].(string)
			topics[i], ok[1] = a[1].(string)
			part, ok[2] = a[2].(int)
			cursors[i], ok[3] = a[3].(int64)
			owners[i], ok[4] = a[4].(string)
			tokens[i], ok[5] = a[5].(int64)
			limit, ok[6] = a[6].(int)
			whole[i], ok[7] = a[7].(bool)
			solo[i], ok[8] = a[8].(bool)
		}
		if ok != [9]bool{true, true, true, true, true, true, true, true, true} || (i > 0 && g != group) {
			return nil, fmt.Errorf("outbox: counted read %d: unexpected arguments %v", i, a)
		}
		group, parts[i], limits[i] = g, int32(part), int32(limit)
	}
	return []any{group, topics, parts, cursors, owners, tokens, limits, whole, solo}, nil
}

// mergeAdvances is CursorsAdvanceRelaxedMany's arguments for
// CursorsAdvanceRelaxed's calls (internal/lease's Advance): one array per
// parameter.
func mergeAdvances(calls [][]any) ([]any, error) {
	n := len(calls)
	groups, topics, parts, members, tokens, seqs := make([]string, n), make([]string, n), make([]int32, n), make([]string, n), make([]int64, n), make([]int64, n)
	for i, a := range calls {
		var ok [6]bool
		var part int
		if len(a) == 6 {
			groups[i], ok[0] = a[0].(string)
			topics[i], ok[1] = a[1].(string)
			part, ok[2] = a[2].(int)
			members[i], ok[3] = a[3].(string)
			tokens[i], ok[4] = a[4].(int64)
			seqs[i], ok[5] = a[5].(int64)
		}
		if ok != [6]bool{true, true, true, true, true, true} {
			return nil, fmt.Errorf("outbox: cursor move %d: unexpected arguments %v", i, a)
		}
		parts[i] = int32(part)
	}
	return []any{groups, topics, parts, members, tokens, seqs}, nil
}

// Relaxed is what the statements that commit without waiting for their WAL
// flush run on: give it to the lease manager (lease.Config.Relaxed) so that
// cursor moves share round trips with the counted reads.
func (s *PGStore) Relaxed() pgexec.Querier { return s.relaxed }

// Read implements Store.
func (s *PGStore) Read(ctx context.Context, topic string, partition int, cursor int64, limit int, fence Lease, wholeBatch, solo bool) ([]Entry, *int32, error) {
	var rows pgexec.Rows
	var err error
	if fence == nil {
		rows, err = s.db.Query(ctx, s.q.LogRead, topic, partition, cursor, limit)
	} else {
		rows, err = s.relaxed.Query(ctx, s.q.LogReadCounting, s.group, topic, partition, cursor, fence.Owner(), fence.Token(), limit, wholeBatch, solo)
	}
	if err != nil {
		return nil, nil, schemacheck.Wrap(err, s.schema)
	}
	entries, counted, err := scanEntries(rows, limit)
	if err != nil {
		return nil, nil, schemacheck.Wrap(err, s.schema)
	}
	return entries, counted, nil
}

// ReadSeqs implements Store.
func (s *PGStore) ReadSeqs(ctx context.Context, topic string, partition int, seqs []int64) ([]Entry, error) {
	rows, err := s.db.Query(ctx, s.q.LogReadSeqs, topic, partition, seqs)
	if err != nil {
		return nil, err
	}
	entries, _, err := scanEntries(rows, len(seqs))
	return entries, err
}

// scanEntries reads log rows (seq, uuid, key, metadata, payload, whether
// the payload is missing, published and sequenced at, count) and closes them; counted is the last
// row's count.
func scanEntries(rows pgexec.Rows, capacity int) (_ []Entry, counted *int32, _ error) {
	defer rows.Close()
	entries := make([]Entry, 0, capacity)
	for rows.Next() {
		var e Entry
		if err := rows.Scan(&e.Seq, &e.UUID, &e.Key, &e.Metadata, &e.Payload, &e.PayloadMissing, &e.PublishedAt, &e.SequencedAt, &counted); err != nil {
			return nil, nil, err
		}
		entries = append(entries, e)
	}
	return entries, counted, rows.Err()
}

// Begin implements Store.
func (s *PGStore) Begin(ctx context.Context) (pgx.Tx, error) { return s.pool.Begin(ctx) }

// InTx implements Store.
func (s *PGStore) InTx(ctx context.Context, relaxed bool, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if relaxed {
			if _, err := tx.Exec(ctx, s.q.TxRelaxedCommit); err != nil {
				return err
			}
		}
		return fn(tx)
	})
}

// Savepoint implements Store.
func (s *PGStore) Savepoint(ctx context.Context, tx pgx.Tx, op SavepointOp) error {
	var stmt string
	switch op {
	case SavepointFirst:
		stmt = s.q.TxSavepointDelivery
	case SavepointNext:
		stmt = s.q.TxNextDelivery
	case SavepointRelease:
		stmt = s.q.TxReleaseDelivery
	case SavepointRollback:
		stmt = s.q.TxRollbackDelivery
	case SavepointBatch:
		stmt = s.q.TxSavepointBatch
	case SavepointBatchRelease:
		stmt = s.q.TxReleaseBatch
	case SavepointBatchRollback:
		stmt = s.q.TxRollbackBatch
	default:
		return fmt.Errorf("outbox: savepoint operation %d", op)
	}
	_, err := tx.Exec(ctx, stmt)
	return err
}

// SaveAdaptive implements Store.
func (s *PGStore) SaveAdaptive(ctx context.Context, topic string, partition int, token int64, state string, size int) error {
	_, err := s.db.Exec(ctx, s.q.CursorsSaveAdaptive, s.group, topic, partition, token, state, size)
	return err
}

// MarkInFlight implements Store, through the Marker.
func (s *PGStore) MarkInFlight(ctx context.Context, topic string, l Lease, seq int64) (bool, error) {
	return s.marker.mark(ctx, topic, l, seq)
}

// fence returns the parameters every held.sql statement of a worker starts
// with.
func (s *PGStore) fence(topic string, l Lease, more ...any) []any {
	return append([]any{s.group, topic, l.Partition(), l.Owner(), l.Token()}, more...)
}

// HeldAdopt implements HeldStore.
func (s *PGStore) HeldAdopt(ctx context.Context, topic string, l Lease) error {
	if _, err := s.db.Exec(ctx, s.q.HeldAdopt, s.fence(topic, l)...); err != nil {
		return fmt.Errorf("outbox: adopt held messages: %w", err)
	}
	return nil
}

// HeldLoad implements HeldStore.
func (s *PGStore) HeldLoad(ctx context.Context, topic string, partition int) ([]HeldRow, error) {
	rows, err := s.db.Query(ctx, s.q.HeldLoad, s.group, topic, partition)
	if err != nil {
		return nil, fmt.Errorf("outbox: load held messages: %w", err)
	}
	defer rows.Close()
	var out []HeldRow
	for rows.Next() {
		var r HeldRow
		var attempts, deliveries int32
		if err := rows.Scan(&r.Seq, &r.Keyless, &r.Key, &attempts, &deliveries, &r.LastError, &r.FirstFailure, &r.RetryAt, &r.Requested, &r.Suspect); err != nil {
			return nil, err
		}
		r.Attempts, r.Deliveries = int(attempts), int(deliveries)
		out = append(out, r)
	}
	return out, rows.Err()
}

// HeldInsert implements HeldStore.
func (s *PGStore) HeldInsert(ctx context.Context, tx pgx.Tx, topic string, partition int, rows []Hold) error {
	n := len(rows)
	seqs, keys, attempts, errTexts, delays := make([]int64, n), make([]*string, n), make([]int32, n), make([]*string, n), make([]int64, n)
	for i, r := range rows {
		seqs[i], attempts[i], delays[i] = r.Seq, int32(r.Attempts), r.Delay.Microseconds()
		if !r.Keyless {
			keys[i] = &rows[i].Key
		}
		if r.Err != "" {
			errTexts[i] = &rows[i].Err
		}
	}
	if _, err := tx.Exec(ctx, s.q.HeldInsert, s.group, topic, partition, seqs, keys, attempts, errTexts, delays); err != nil {
		return fmt.Errorf("outbox: hold messages back: %w", err)
	}
	return nil
}

// HeldCount implements HeldStore.
func (s *PGStore) HeldCount(ctx context.Context, topic string, l Lease, seq int64, solo bool) (int, bool, error) {
	var deliveries int32
	err := pgexec.QueryRow(ctx, s.db, s.q.HeldCount, s.fence(topic, l, seq, solo), &deliveries)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return int(deliveries), err == nil, err
}

// HeldUndoCount implements HeldStore.
func (s *PGStore) HeldUndoCount(ctx context.Context, topic string, l Lease, seq int64) error {
	_, err := s.db.Exec(ctx, s.q.HeldUndoCount, s.fence(topic, l, seq)...)
	return err
}

// HeldRetry implements HeldStore.
func (s *PGStore) HeldRetry(ctx context.Context, topic string, l Lease, seq int64, text string, delay time.Duration) (bool, error) {
	n, err := s.db.Exec(ctx, s.q.HeldRetry, s.fence(topic, l, seq, text, delay.Microseconds())...)
	return n > 0, err
}

// HeldRelease implements HeldStore.
func (s *PGStore) HeldRelease(ctx context.Context, tx pgx.Tx, topic string, l Lease, seqs []int64) (int, error) {
	var n int64
	var err error
	if tx != nil {
		var tag interface{ RowsAffected() int64 }
		tag, err = tx.Exec(ctx, s.q.HeldRelease, s.fence(topic, l, seqs)...)
		if err == nil {
			n = tag.RowsAffected()
		}
	} else {
		n, err = s.db.Exec(ctx, s.q.HeldRelease, s.fence(topic, l, seqs)...)
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: release held messages: %w", err)
	}
	return int(n), nil
}

// HeldShowFull implements HeldStore.
func (s *PGStore) HeldShowFull(ctx context.Context, topic string, l Lease, full bool) error {
	_, err := s.db.Exec(ctx, s.q.HeldShowFull, s.fence(topic, l, full)...)
	return err
}

// PGLease is the Lease of a partition: internal/lease's, on the lease
// manager's Store (PostgreSQL's, or the simulator's model).
type PGLease struct{ *lease.Lease }

var _ Lease = PGLease{}
