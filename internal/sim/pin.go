package sim

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/lease"
)

// The models on their own, without a scheduler (every call answers at
// once), for the tests of integration/sim that pin them to PostgreSQL and
// to kgo on kfake.

// DBModel is the database model of one consumer group.
type DBModel struct {
	d *db
	c *conn
}

// NewDBModel returns an empty database model for consumer group group, on
// the clock now.
func NewDBModel(group string, now func() time.Time) *DBModel {
	d := newDB(now)
	return &DBModel{d: d, c: &conn{d: d, group: group, txs: map[*simTx]bool{}}}
}

// Lease is the model as lease.Store.
func (m *DBModel) Lease() lease.Store { return m.c }

// Store is the model as consumer.Store.
func (m *DBModel) Store() consumer.Store { return m.c }

// Begin opens a transaction.
func (m *DBModel) Begin(ctx context.Context) (pgx.Tx, error) { return m.c.Begin(ctx) }

// Append appends messages (uuid and key) to partition of topic.
func (m *DBModel) Append(topic string, partition int, uuid, key string) {
	m.d.appendLog(tp{topic, partition}, []logRow{{uuid: uuid, key: key, metadata: map[string]string{}, payload: []byte(uuid)}})
}

// Expire makes the lease of the cursor row of (group, topic, partition)
// expired, as time passing would.
func (m *DBModel) Expire(group, topic string, partition int) {
	if r := m.d.cursors[cursorKey{group, topic, partition}]; r != nil {
		r.expires = m.d.now().Add(-time.Second)
	}
}

// CursorRow is a cursor row as the pinning tests compare it.
type CursorRow struct {
	Seq, Token               int64
	Owner                    string
	Live                     bool
	Attempts, Deliveries     int64
	Unexplained              int64
	InflightFrom, InflightTo int64
	InflightSolo             bool
	SuspectFrom, SuspectTo   int64
	LastError                string
	BackingOff               bool
	Missing                  bool
}

// Cursor returns the committed cursor row of (group, topic, partition).
func (m *DBModel) Cursor(group, topic string, partition int) CursorRow {
	r := m.d.cursors[cursorKey{group, topic, partition}]
	if r == nil {
		return CursorRow{Missing: true}
	}
	now := m.d.now()
	return CursorRow{
		Seq: r.seq, Token: r.token, Owner: r.owner, Live: r.owner != "" && !r.expires.IsZero() && r.expires.After(now),
		Attempts: r.attempts, Deliveries: r.deliveries, Unexplained: r.unexplained,
		InflightFrom: r.inflightFrom, InflightTo: r.inflightTo, InflightSolo: r.inflightSolo,
		SuspectFrom: r.suspectFrom, SuspectTo: r.suspectTo, LastError: r.lastError,
		BackingOff: !r.backoffUntil.IsZero() && r.backoffUntil.After(now),
	}
}

// KafkaModel is the Kafka model on its own.
type KafkaModel struct{ k *kafka }

// NewKafkaModel returns an empty Kafka model: max message size
// maxMessageBytes, the clients' batches of at most batchBytes, records
// placed by partitioner. kfakeOrder makes a refused produce of a fenced
// producer register its partition in the transaction first, as kfake does
// (a real broker checks the epoch first).
func NewKafkaModel(maxMessageBytes, batchBytes int, partitioner kgo.Partitioner, kfakeOrder bool) *KafkaModel {
	k := newKafka(time.Now, time.Minute, maxMessageBytes, batchBytes, partitioner)
	k.kfakeOrder = kfakeOrder
	return &KafkaModel{k: k}
}

// CreateTopic creates topic with partitions partitions.
func (m *KafkaModel) CreateTopic(topic string, partitions int) { m.k.createTopic(topic, partitions) }

// Driver returns a client of the model.
func (m *KafkaModel) Driver() kafkadriver.Driver { return &kafkaDriver{k: m.k} }
