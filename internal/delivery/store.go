package delivery

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
)

// Store is the workers' access to the database, apart from the cursor
// writes, which go through their Lease: reading the log, the transactions
// of the Transactional strategy and their savepoints, and the adaptive
// state shown by the admin status. Its statements are in internal/dbsql
// (log.sql, transaction.sql, cursors.sql).
type Store struct {
	pool   *pgxpool.Pool
	db     pgexec.DB
	q      *dbsql.Queries
	schema string
	group  string
}

// NewStore returns the store of consumer group on the outbox in schema.
func NewStore(pool *pgxpool.Pool, schema, group string) *Store {
	db, _ := pgexec.FromDB(pool) // a *pgxpool.Pool always adapts
	return &Store{pool: pool, db: db, q: dbsql.For(schema), schema: schema, group: group}
}

// DB runs single statements, each in a transaction of its own.
func (s *Store) DB() pgexec.DB { return s.db }

// Read returns up to limit log entries of the partition after cursor, in
// seq order. With fence set, the same statement counts a delivery of the
// head message (cursor+1) on the cursor row, fenced by the lease, records
// what is in flight (the head, or with wholeBatch every entry returned;
// solo: the only delivery in flight in the process) and returns the count;
// nil when nothing was counted (no head, or the fence did not hold).
func (s *Store) Read(ctx context.Context, topic string, partition int, cursor int64, limit int, fence Lease, wholeBatch, solo bool) ([]logEntry, *int32, error) {
	var rows pgexec.Rows
	var err error
	if fence == nil {
		rows, err = s.db.Query(ctx, s.q.LogRead, topic, partition, cursor, limit)
	} else {
		rows, err = s.db.Query(ctx, s.q.LogReadCounting, s.group, topic, partition, cursor, fence.Owner(), fence.Token(), limit, wholeBatch, solo)
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

// scanEntries reads log rows (seq, uuid, key, metadata, payload, whether
// the payload is missing, count) and closes them; counted is the last
// row's count.
func scanEntries(rows pgexec.Rows, capacity int) (_ []logEntry, counted *int32, _ error) {
	defer rows.Close()
	entries := make([]logEntry, 0, capacity)
	for rows.Next() {
		var e logEntry
		if err := rows.Scan(&e.seq, &e.uuid, &e.key, &e.metadata, &e.payload, &e.payloadMissing, &counted); err != nil {
			return nil, nil, err
		}
		entries = append(entries, e)
	}
	return entries, counted, rows.Err()
}

// Begin starts the transaction of a Transactional batch.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) { return s.pool.Begin(ctx) }

// InTx runs fn in a transaction of its own, committed when fn returns nil.
func (s *Store) InTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, fn)
}

// Savepoints are the statements of transaction.sql.
func (s *Store) Savepoints() *dbsql.Queries { return s.q }

// SaveAdaptive records a partition's adaptive state on its cursor row,
// fenced by the lease token.
func (s *Store) SaveAdaptive(ctx context.Context, topic string, partition int, token int64, state string, size int) error {
	_, err := s.db.Exec(ctx, s.q.CursorsSaveAdaptive, s.group, topic, partition, token, state, size)
	return err
}
