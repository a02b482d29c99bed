package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/direct"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/relaydriver"
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

// ForgetWriter makes the writer of the cursor row of (group, topic,
// partition) unknown (NULL), as Migrate leaves the rows of a schema from
// before writer records (0015_cursor_writer.sql).
func (m *DBModel) ForgetWriter(group, topic string, partition int) {
	if r := m.d.cursors[cursorKey{group, topic, partition}]; r != nil {
		r.writer, r.writerNull = "", true
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

// WALModel is the model of the log-based mode's WAL, slot and tables, on
// its own: a relay (package relay, through relaydriver.Run) runs on its
// Backend and appends to its log.
type WALModel struct {
	d *db
	w *wal
}

// NewWALModel returns an empty WAL of the outbox schema schema.
func NewWALModel(schema string) *WALModel {
	d := newDB(time.Now)
	return &WALModel{d: d, w: newWAL(d, schema)}
}

// WALMessage is a message a publisher writes into the WAL.
type WALMessage struct {
	Partition int
	Key, UUID string
	Payload   []byte
}

// Commit commits a publisher's transaction of msgs (topic "orders").
func (m *WALModel) Commit(msgs ...WALMessage) {
	pm := make([]pubMsg, len(msgs))
	for i, x := range msgs {
		pm[i] = pubMsg{uuid: x.UUID, key: x.Key, partition: x.Partition, payload: x.Payload}
	}
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	m.w.commit(pm)
}

// ForwardOnly makes topic "orders" forwarder-only: the relay puts its
// messages into pending (PendingRows), not the log.
func (m *WALModel) ForwardOnly() {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	m.w.forwardOnly = true
}

// PendingRows returns the pending rows as "partition:uuid:key", by id.
func (m *WALModel) PendingRows() []string {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	var out []string
	for _, r := range m.d.pendingByID() {
		out = append(out, fmt.Sprintf("%d:%s:%s", r.partition, r.uuid, r.key))
	}
	return out
}

// Backend is the model as a relay's relaydriver.Backend.
func (m *WALModel) Backend() relaydriver.Backend { return &walBackend{w: m.w} }

// LogEntry is a message of the log.
type LogEntry struct {
	Seq       int64
	UUID, Key string
}

// Log returns partition's messages of topic "orders" in the log.
func (m *WALModel) Log(partition int) []LogEntry {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	var out []LogEntry
	for _, r := range m.d.log[tp{topic, partition}] {
		out = append(out, LogEntry{Seq: r.seq, UUID: r.uuid, Key: r.key})
	}
	return out
}

// Pending is the model of a forwarder-only topic's pending rows as the
// loop's store (internal/direct).
func (m *DBModel) Pending() direct.Store { return m.c }

// PendingTxn is a publisher's transaction on the model's pending rows.
type PendingTxn struct{ op *openPub }

// InsertPending inserts a message (uuid, key) into partition of a
// forwarder-only topic in a new transaction, its id drawn now; Commit
// makes it seen.
func (m *DBModel) InsertPending(partition int, uuid, key string) PendingTxn {
	rows := m.d.insertPending([]pendingRow{{partition: partition, uuid: uuid, key: key, payload: []byte(uuid)}})
	return PendingTxn{&openPub{rows: rows}}
}

// Commit commits the transaction.
func (t PendingTxn) Commit(m *DBModel) { m.d.commitPending(t.op.rows) }

// PendingRows returns the committed pending rows as "id:partition:uuid",
// by id.
func (m *DBModel) PendingRows() []string {
	var out []string
	for _, r := range m.d.pendingByID() {
		out = append(out, fmt.Sprintf("%d:%d:%s", r.id, r.partition, r.uuid))
	}
	return out
}

// LastSeq returns partitions.last_seq of partition (forwarder-only).
func (m *DBModel) LastSeq(partition int) int64 { return m.d.pendingState().lastSeq[partition] }
