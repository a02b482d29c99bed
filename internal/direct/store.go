package direct

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/dbsql"
)

// Store is the database a Loop works on: PostgreSQL (NewPGStore), or the
// simulator's model (internal/sim), which integration/sim pins to it.
type Store interface {
	// ReadPending reads, for each of partitions, at most limit of its
	// committed pending rows in id order (PendingForwardRead), by
	// partition.
	ReadPending(ctx context.Context, topic string, partitions []int32, limit int, now time.Time) ([]Row, error)
	// Begin begins the transaction a round is recorded in.
	Begin(ctx context.Context) (pgx.Tx, error)
	// Forwarded records moves in tx (PendingForwarded; nil: a statement
	// of its own) and returns the partitions whose cursor moved: those
	// whose lease (owner, token) still holds.
	Forwarded(ctx context.Context, tx pgx.Tx, group, topic, owner string, moves []Move) (map[int]bool, error)
}

// Row is a pending row as a forwarder reads it.
type Row struct {
	Partition int
	ID        int64
	UUID, Key string
	Metadata  map[string]string
	Payload   []byte
}

// Move records a partition forwarded: its cursor to Last under the lease
// of Token, the pending rows IDs gone.
type Move struct {
	Partition   int
	Token, Last int64
	IDs         []int64
}

// NewPGStore returns the Store of schema on pool.
func NewPGStore(pool *pgxpool.Pool, schema string) Store {
	return pgStore{pool: pool, q: dbsql.For(schema)}
}

type pgStore struct {
	pool *pgxpool.Pool
	q    *dbsql.Queries
}

func (s pgStore) ReadPending(ctx context.Context, topic string, partitions []int32, limit int, now time.Time) ([]Row, error) {
	rows, err := s.pool.Query(ctx, s.q.PendingForwardRead, topic, partitions, limit, now)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var (
			r       Row
			p       int32
			missing bool
			created time.Time
		)
		if err := rows.Scan(&p, &r.ID, &r.UUID, &r.Key, &r.Metadata, &r.Payload, &missing, &created); err != nil {
			return nil, err
		}
		// missing cannot be true here: a bodies row leaves with its
		// pending row (PendingForwarded), and retention does not touch
		// pending.
		r.Partition = int(p)
		out = append(out, r)
	}
	return out, rows.Err()
}

func (s pgStore) Begin(ctx context.Context) (pgx.Tx, error) { return s.pool.Begin(ctx) }

func (s pgStore) Forwarded(ctx context.Context, tx pgx.Tx, group, topic, owner string, moves []Move) (map[int]bool, error) {
	ps := make([]int32, len(moves))
	tokens := make([]int64, len(moves))
	lasts := make([]int64, len(moves))
	var idParts []int32
	var ids []int64
	for i, m := range moves {
		ps[i], tokens[i], lasts[i] = int32(m.Partition), m.Token, m.Last
		for _, id := range m.IDs {
			idParts = append(idParts, int32(m.Partition))
			ids = append(ids, id)
		}
	}
	var rows pgx.Rows
	var err error
	if tx == nil {
		rows, err = s.pool.Query(ctx, s.q.PendingForwarded, group, topic, owner, ps, tokens, lasts, idParts, ids)
	} else {
		rows, err = tx.Query(ctx, s.q.PendingForwarded, group, topic, owner, ps, tokens, lasts, idParts, ids)
	}
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	moved := map[int]bool{}
	for rows.Next() {
		var p int32
		if err := rows.Scan(&p); err != nil {
			return nil, err
		}
		moved[int(p)] = true
	}
	return moved, rows.Err()
}
