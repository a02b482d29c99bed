package kafka

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/forward"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/origin"
	"github.com/millrace/watermill-outbox/internal/startstop"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Target publishes outbox batches to Kafka; it implements forwarder.Target.
// Records are built by the Marshaler, keyed by Config.Key and placed by
// Partitioner.
//
// kgo does the protocol: connections, metadata, batching into one record
// batch per partition, produce requests, retries of what may be retried,
// idempotent sequence numbers and, exactly once, the transactions
// (InitProducerId, AddPartitionsToTxn, EndTxn, the coordinator's moves and
// CONCURRENT_TRANSACTIONS). The target decides per Send what was delivered
// and what to do about the rest:
//
//   - Send reports as done the messages before the first record that
//     failed. kgo fails a partition's records after one that failed, and
//     a Send hands kgo all the records of a try before any is sent (a
//     transaction, or a manual flush at least once), so no later record of
//     a partition is stored after an earlier one failed: per-key order
//     holds through failures. At least once,
//     records of other partitions behind the failure may have been stored:
//     they are sent again with the rest (copies, with the same outbox_id
//     header). Exactly once, a failed Send aborts its transaction: nothing
//     of it is visible to read_committed consumers.
//   - Errors that no retry can cure take the message out of the stream with
//     outbox.Reject: a marshal failure, a tombstone the target cannot send
//     as one or a message it cannot make a CloudEvent of (tombstone.go,
//     cloudevents.go; *outboxtype.MessageError), a record larger than
//     Config.MaxBatchBytes, an invalid topic name, and the broker's
//     MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE or INVALID_RECORD for a
//     record alone in its record batch. When the broker refuses a record
//     batch of several records with one of these, the same Send sends fewer
//     records at a time until the record to blame is alone: the records
//     before it are delivered, it is rejected on its first attempt. Records
//     the smaller sends already stored are not sent again by this Send.
//     Without compression, the size of a record the broker refused alone is
//     remembered per topic for a minute, and records at least that large
//     are rejected without being sent.
//   - Everything else (broker down, leader elections, timeouts, not enough
//     replicas, an unknown topic, a fenced producer) is a transient error,
//     retried by the forwarder with backoff.
//
// Each outbox partition has a kgo client of its own, in both modes (kgo
// needs one per transactional id; at_least_once.go says why at least once
// needs one too); see Config.ProducerIdleTimeout for how many stay open.
// One more client, shared, checks and creates topics.
type Target struct {
	cfg        Config
	logger     watermill.LoggerAdapter
	defaultKey bool // cfg.Key is the default: placement follows the outbox
	newDriver  kafkadriver.Factory

	mu        sync.Mutex
	closed    bool
	driver    kafkadriver.Driver   // made on the first use: topics, the tail read, producers
	producers map[string]*producer // at least once, by id
	txn       *txnProducer         // exactly once
	refused   map[string]refusedSize

	// life is the target's lifecycle (internal/startstop): started by the
	// first connect, it runs the idle sweep and the closes of clients left
	// in doubt (closeLater); Close stops and waits for them, and its
	// Closing channel cuts the sends' waits short (a linger, a round).
	life startstop.Service
}

// NewTarget creates a Target. It connects on the first Send, so that a
// forwarder can start while Kafka is unreachable. logger may be nil (no
// logs).
func NewTarget(cfg Config, logger watermill.LoggerAdapter) (*Target, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newTarget(cfg, logger, nil, newInstanceID()), nil
}

// newTarget makes a Target of a valid cfg on the drivers newDriver makes
// (nil: kgo's, with cfg's client options).
func newTarget(cfg Config, logger watermill.LoggerAdapter, newDriver kafkadriver.Factory, instance string) *Target {
	defaultKey := cfg.Key == nil
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	if newDriver == nil {
		newDriver = func(watermill.LoggerAdapter) (kafkadriver.Driver, error) {
			return kafkadriver.NewKgo(cfg.clientOptions, cfg.transactional)
		}
	}
	return &Target{
		cfg:        cfg,
		logger:     logger.With(watermill.LogFields{"component": "outbox.forwarder.kafka"}),
		defaultKey: defaultKey,
		newDriver:  newDriver,
		producers:  map[string]*producer{},
		txn:        newTxnProducer(cfg.TransactionalIDPrefix + "/" + instance),
		refused:    map[string]refusedSize{},
		life:       startstop.Service{Name: "kafka.Target"},
	}
}

// CheckKeyIsolation implements forwarder.KeyIsolationChecker: exactly-once
// delivery refuses the Subscriber's key isolation, since a held message
// would be sent after newer ones and the tail read of the partition's next
// owner would take it for one already written and skip it.
func (t *Target) CheckKeyIsolation() error {
	if t == nil || t.cfg.AtLeastOnce {
		return nil
	}
	return &outboxtype.ConfigError{Field: "Subscriber.KeyIsolation", Reason: "cannot be combined with exactly-once delivery into Kafka, which needs each partition's messages in seq order; set kafka.Config.AtLeastOnce (consumers then dedup by outbox_id, e.g. with the inbox) or leave isolation off"}
}

var _ forwarder.Target = (*Target)(nil)
var _ forwarder.KeyIsolationChecker = (*Target)(nil)

// connect returns the target's driver, made on the first call.
func (t *Target) connect() (kafkadriver.Driver, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, outbox.ErrClosed
	}
	if t.driver == nil {
		d, err := t.newDriver(t.logger)
		if err != nil {
			return nil, err
		}
		t.driver = d
		_ = t.life.Start(context.Background(), t.sweepIdle) // (once: the target is not closed)
	}
	return t.driver, nil
}

// closeLater closes cl, a client left in doubt, on a goroutine of the
// target's (closing waits for nothing the send needs); Close waits for it.
// Once the target closes, it closes cl at once.
func (t *Target) closeLater(cl *producerClient) {
	if !t.life.Spawn(func(context.Context) { cl.close() }) {
		cl.close()
	}
}

// compressed reports whether the driver compresses record batches (false
// before the first connect).
func (t *Target) compressed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.driver != nil && t.driver.Compressed()
}

// Close closes every client of the target: sends in flight fail. It waits
// until they returned and every client is closed. A second Close does
// nothing.
func (t *Target) Close() error {
	if t == nil || t.txn == nil {
		return nil
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	producers := make([]*producer, 0, len(t.producers))
	for id, p := range t.producers {
		producers = append(producers, p)
		delete(t.producers, id)
	}
	driver := t.driver
	t.mu.Unlock()
	// The rounds and lingers under way end (Closing), the idle sweep
	// stops, and the clients being closed in the background are closed.
	t.life.Close()
	// Closing a client fails what it has in flight, so that the sends
	// using it return; then wait for them.
	for _, p := range producers {
		if cl := p.client.Swap(nil); cl != nil {
			cl.close()
		}
	}
	if cl := t.txn.client.Swap(nil); cl != nil {
		cl.close()
	}
	if driver != nil {
		driver.Close()
	}
	for _, p := range producers {
		p.mu.Lock()
		p.retire()
		p.mu.Unlock()
	}
	t.txn.waitIdle()
	return nil
}

// Send implements forwarder.Target.
func (t *Target) Send(ctx context.Context, topic string, batch []*message.Message) (int, error) {
	return t.send(ctx, origin.Origin{}, topic, batch)
}

// The Forwarder sends with the batch's origin given (internal/forward's
// Explicit): its source, schema, group and the topic's partition count
// name and fence the producers; no value travels in the context.
func init() {
	forward.Explicit = func(target any) (forward.Send, bool) {
		t, ok := target.(*Target)
		if !ok || t == nil {
			return nil, false
		}
		return t.send, true
	}
}

// send is Send with the Forwarder's part of the batch's origin (empty
// when the target is used on its own).
func (t *Target) send(ctx context.Context, from origin.Origin, topic string, batch []*message.Message) (int, error) {
	if t == nil || t.producers == nil {
		return 0, errs.NotConstructed("kafka.Target", "kafka.NewTarget")
	}
	if ctx == nil {
		return 0, errs.NilArgument("kafka.Target.Send: ctx", "pass a context")
	}
	for i, m := range batch {
		if m == nil {
			return 0, &outboxtype.MessageError{UUID: "(nil)", Reason: fmt.Sprintf("message %d (0-based) of the batch of %d is nil; nothing was sent", i, len(batch))}
		}
	}
	if len(batch) == 0 {
		return 0, nil
	}
	if topic == "" {
		return 0, fmt.Errorf("%w: kafka.Target.Send: empty topic", outbox.ErrInvalidArgument)
	}
	if err := checkTopic(topic); err != nil {
		return 0, t.reject(batch[0], err)
	}
	driver, err := t.connect()
	if err != nil {
		return 0, err
	}
	if t.cfg.AtLeastOnce {
		return t.sendAtLeastOnce(ctx, driver, from, topic, batch)
	}
	return t.sendExactlyOnce(ctx, driver, from, topic, batch)
}

// checkTopic refuses a topic name Kafka refuses: empty, "." or "..",
// longer than 249 characters, or with a character other than ASCII
// letters, digits, '.', '_' and '-' (as the broker's INVALID_TOPIC_EXCEPTION).
func checkTopic(topic string) error {
	if topic == "." || topic == ".." || len(topic) > 249 {
		return fmt.Errorf("topic %q: %w", topic, kerr.InvalidTopicException)
	}
	for _, c := range topic {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic %q: %w", topic, kerr.InvalidTopicException)
		}
	}
	return nil
}

// outRecord is one message of a batch on its way to Kafka.
type outRecord struct {
	index  int // in the batch given to build
	record *kgo.Record
	size   int // upper bound of its encoded size in a record batch
}

// Bounds of the encoded sizes: the record batch header, and what a record
// adds besides its key, value and headers.
const (
	recordBatchOverhead   = 61
	maximumRecordOverhead = 5*binary.MaxVarintLen32 + binary.MaxVarintLen64 + 1
)

// build makes the records of batch, up to the first message that cannot
// be sent (bad says why; nil when every message has its record).
func (t *Target) build(ctx context.Context, topic string, batch []*message.Message) (records []outRecord, bad error) {
	refusedAt := 0
	if !t.compressed() {
		refusedAt = t.refusedAt(topic)
	}
	records = make([]outRecord, 0, len(batch))
	for i, msg := range batch {
		r, err := t.record(ctx, topic, msg)
		switch {
		case err != nil:
		case r.size+recordBatchOverhead > t.cfg.MaxBatchBytes:
			err = fmt.Errorf("record of %d bytes is larger than MaxBatchBytes (%d): %w", r.size, t.cfg.MaxBatchBytes, kerr.MessageTooLarge)
		case refusedAt > 0 && r.size+recordBatchOverhead >= refusedAt:
			err = fmt.Errorf("record of %d bytes: the broker refused a record of %d bytes as too large (its message.max.bytes) within the last %v: %w",
				r.size, refusedAt-recordBatchOverhead, refusedFor, kerr.MessageTooLarge)
		}
		if err != nil {
			return records, err
		}
		r.index = i
		records = append(records, r)
	}
	return records, nil
}

func (t *Target) record(ctx context.Context, topic string, msg *message.Message) (outRecord, error) {
	r, err := t.cfg.Marshaler.Marshal(topic, forwarder.Outgoing(msg))
	if err != nil {
		return outRecord{}, fmt.Errorf("marshal message %s: %w", msg.UUID, err)
	}
	if r == nil {
		return outRecord{}, fmt.Errorf("marshal message %s: the Marshaler returned no record", msg.UUID)
	}
	r.Topic = topic
	if key := t.cfg.Key(msg); len(key) > 0 {
		r.Key = key
	}
	tomb, err := tombstoneRecord(msg, r)
	if err != nil {
		return outRecord{}, err
	}
	if t.cfg.CloudEvents.Mode != forwarder.CloudEventsOff {
		if err := cloudEvent(t.cfg.CloudEvents, r, msg, tomb); err != nil {
			return outRecord{}, err
		}
	}
	if !t.cfg.AtLeastOnce {
		// The tail read after a takeover finds the partition's last record
		// by these, whatever the Marshaler writes.
		r.Headers = ensureHeader(r.Headers, outbox.MetadataID, msg.Metadata.Get(outbox.MetadataID))
		r.Headers = ensureHeader(r.Headers, outbox.MetadataIncarnation, msg.Metadata.Get(outbox.MetadataIncarnation))
		r.Headers = ensureHeader(r.Headers, outbox.MetadataSource, msg.Metadata.Get(outbox.MetadataSource))
	}
	r.Context = withOutboxPartition(ctx, origin.Partition(msg))
	size := maximumRecordOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		size += len(h.Key) + len(h.Value) + 2*binary.MaxVarintLen32
	}
	return outRecord{record: r, size: size}, nil
}

// ensureHeader adds header key with value unless headers hold it (or value
// is empty).
func ensureHeader(headers []kgo.RecordHeader, key, value string) []kgo.RecordHeader {
	if value == "" {
		return headers
	}
	for _, h := range headers {
		if h.Key == key {
			return headers
		}
	}
	return append(headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

// firstFailed returns the position of the first record of errs that
// failed, -1 when none did.
func firstFailed(errs []error) int {
	for i, err := range errs {
		if err != nil {
			return i
		}
	}
	return -1
}

// partitionMates counts the records of records from f on that went to the
// Kafka partition of records[f]: the record batch the broker judged with
// it held at most these.
func partitionMates(records []outRecord, f int) int {
	n := 0
	for _, r := range records[f:] {
		if r.record.Partition == records[f].record.Partition {
			n++
		}
	}
	return n
}

// refusedForItsRecords says whether err is the broker judging a record
// batch as too large or invalid, for one of its records.
func refusedForItsRecords(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) || errors.Is(err, kerr.InvalidRecord)
}

// refusedForSize says whether err is the broker judging a record batch as
// too large.
func refusedForSize(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}

// permanentForTopic says whether err means no message can ever be
// published to the topic.
func permanentForTopic(err error) bool {
	return errors.Is(err, kerr.InvalidTopicException)
}

func (t *Target) reject(msg *message.Message, cause error) error {
	if refusedForSize(cause) {
		cause = fmt.Errorf("record too large: %w", cause)
	}
	t.logger.Error("Kafka cannot take the message, ever: rejecting it", cause, watermill.LogFields{"id": msg.Metadata.Get(outbox.MetadataID)})
	return outbox.Reject(msg, fmt.Errorf("kafka: %w", cause))
}

type refusedSize struct {
	bytes int
	at    time.Time
}

// refusedFor is how long a size the broker refused is remembered.
const refusedFor = time.Minute

// refusedAt returns the smallest single-record batch size the broker
// refused for topic recently (0: none).
func (t *Target) refusedAt(topic string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.refused[topic]
	if !ok || time.Since(r.at) > refusedFor {
		return 0
	}
	return r.bytes
}

func (t *Target) noteRefused(topic string, bytes int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r, ok := t.refused[topic]; !ok || bytes < r.bytes || time.Since(r.at) > refusedFor {
		t.refused[topic] = refusedSize{bytes: bytes, at: time.Now()}
	}
}
