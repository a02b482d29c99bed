package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/pgtext"
)

// DefaultMaxReasonBytes bounds the reason text a dead letter stores when
// nobody says otherwise (deadletter.Config.MaxReasonBytes).
const DefaultMaxReasonBytes = 4096

// DeadLetterQuerier is what a pgx.Tx and a *pgxpool.Pool have in common
// for InsertDeadLetter.
type DeadLetterQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// InsertDeadLetter stores m in the dead_letters table of q's schema
// through db (the rejecting transaction, or a pool), its texts cleaned for
// PostgreSQL and its reason cut to maxReasonBytes, and reports whether it
// was new: a second write of the same message is a no-op. It is the one
// write of a dead letter: package deadletter's Store and the Subscriber's
// default RejectHandler both use it.
func InsertDeadLetter(ctx context.Context, db DeadLetterQuerier, q *dbsql.Queries, m RejectedMessage, maxReasonBytes int) (bool, error) {
	var partition, seq any
	if m.Seq > 0 {
		partition, seq = int32(m.Partition), m.Seq
	}
	metadata, err := encodeMetadata(m.Metadata)
	if err != nil {
		return false, err
	}
	reason := "rejected"
	if m.Reason != nil {
		reason = m.Reason.Error()
	}
	var key any
	if m.PartitionKey != "" {
		key = pgtext.Clean(m.PartitionKey, 0)
	}
	payload := m.Payload
	if payload == nil {
		payload = []byte{}
	}
	rows, err := db.Query(ctx, q.DeadLettersInsert,
		pgtext.Clean(m.Group, 0), pgtext.Clean(m.Topic, 0), partition, seq, pgtext.Clean(m.UUID, 0), key, metadata,
		payload, pgtext.Clean(reason, maxReasonBytes), max(m.Attempts, 0), timeOrNil(m.FirstFailure), timeOrNil(m.LastFailure))
	if err != nil {
		return false, fmt.Errorf("deadletter: store message %s: %w", m.UUID, err)
	}
	defer rows.Close()
	inserted := rows.Next()
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("deadletter: store message %s: %w", m.UUID, err)
	}
	return inserted, nil
}

func timeOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// encodeMetadata is the metadata as the JSON object the table stores,
// keys and values cleaned for PostgreSQL.
func encodeMetadata(md map[string]string) (string, error) {
	clean := make(map[string]string, len(md))
	for k, v := range md {
		clean[pgtext.Clean(k, 0)] = pgtext.Clean(v, 0)
	}
	b, err := json.Marshal(clean)
	if err != nil {
		return "", fmt.Errorf("deadletter: encode metadata: %w", err)
	}
	return string(b), nil
}
