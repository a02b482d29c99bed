package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's outbox: a pool and a freshly migrated schema.
type env struct {
	pool   *pgxpool.Pool
	schema string
}

func newEnv(t testing.TB) env {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	if err := outbox.Migrate(ctx(t), pool, schema); err != nil {
		t.Fatal(err)
	}
	return env{pool: pool, schema: schema}
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return c
}

func (e env) count(t testing.TB, table string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.schema+"."+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e env) register(t testing.TB, topic string, partitions int) {
	t.Helper()
	if err := outbox.RegisterTopic(ctx(t), e.pool, e.schema, topic, partitions); err != nil {
		t.Fatal(err)
	}
}

func (e env) sequenceAll(t testing.TB) int {
	t.Helper()
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.schema, Pool: e.pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := seq.SequenceAll(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

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
	rows, err := e.pool.Query(context.Background(),
		"SELECT topic, partition, seq, partition_key, uuid, metadata, payload FROM "+e.schema+".log WHERE topic = $1 ORDER BY partition, seq", topic)
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
