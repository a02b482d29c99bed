package outbox_test

import (
	"context"
	"testing"

	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's outbox (see internal/outboxtest): a pool and a freshly
// migrated schema.
type env struct{ *outboxtest.Bundle }

func newEnv(t testing.TB) env { return env{outboxtest.Setup(t)} }

// logRow is one sequenced message read back from the log.
type logRow struct {
	Topic     string
	Partition int
	Seq       int64
	Key       *string
	UUID      string
	Metadata  map[string]string
	Payload   []byte
}

func (e env) readLog(t testing.TB, topic string) []logRow {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(),
		"SELECT l.topic, l.partition, l.seq, l.partition_key, l.uuid, l.metadata, coalesce(l.payload, b.payload) FROM "+e.Schema+".log l LEFT JOIN "+e.Schema+".bodies b ON b.id = l.body_id WHERE l.topic = $1 ORDER BY l.partition, l.seq", topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []logRow
	for rows.Next() {
		var r logRow
		if err := rows.Scan(&r.Topic, &r.Partition, &r.Seq, &r.Key, &r.UUID, &r.Metadata, &r.Payload); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
