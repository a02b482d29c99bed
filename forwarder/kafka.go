package forwarder

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/partitioning"
)

// KafkaConfig configures a KafkaTarget.
type KafkaConfig struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Sarama is the client configuration. Default: DefaultSaramaConfig().
	// Start from it when you need changes. Used from it: Version (at least
	// 0.11), Net, Metadata, ClientID, TLS/SASL, and of Producer:
	// Partitioner, RequiredAcks (not NoResponse), Timeout, Compression,
	// CompressionLevel and MaxMessageBytes (keep it at most the brokers'
	// message.max.bytes). Sarama's producer retries and flushing are not
	// used: the target produces each batch itself (see KafkaTarget).
	Sarama *sarama.Config
	// Marshaler builds the Kafka records (default kafka.DefaultMarshaler, so
	// that watermill-kafka subscribers read them as usual: the Watermill
	// metadata become headers, the message UUID goes in header
	// "_watermill_message_uuid").
	Marshaler kafka.Marshaler
	// Key returns the record key of a message. Default: PartitionKey, the
	// key the message was published to the outbox with. A message without
	// key is placed by the partitioner (see Murmur2Partitioner).
	Key func(msg *message.Message) []byte
	// Logger (default: none).
	Logger watermill.LoggerAdapter

	// AtLeastOnce turns exactly-once delivery off. By default every outbox
	// partition writes through its own Kafka transactional producer, one
	// transaction per batch, and reads back what it already wrote when it
	// (re)gains the partition, so that a Kafka topic never holds two
	// committed copies of an outbox message (see docs/forwarder.md).
	// Consumers must then read with isolation level read_committed (sarama:
	// Consumer.IsolationLevel = sarama.ReadCommitted), or they also see the
	// records of aborted transactions. Turn it off for clusters that do not
	// allow transactions (ACLs, Kafka before 0.11) or consumers that
	// cannot read committed: copies are then possible, each with the same
	// outbox_id header. Every forwarder of a group must use the same mode.
	AtLeastOnce bool
	// TransactionalIDPrefix starts the transactional.id of each outbox
	// partition's producer: "<prefix>/<schema>/<group>/<topic>/<partition>"
	// (schema and group are left out when the target is used without a
	// Forwarder). Default "watermill-outbox". Two outbox databases whose
	// forwarders write to the same Kafka cluster with the same schema,
	// group and topic names must use different prefixes, or they fence
	// each other.
	TransactionalIDPrefix string
	// TransactionTimeout is the transaction.timeout.ms of the producers
	// (default one minute; at most the brokers'
	// transaction.max.timeout.ms). A transaction a forwarder leaves open
	// when it dies holds read_committed consumers of its Kafka partitions
	// back until the partition's next owner starts (it aborts it) or this
	// timeout passes.
	TransactionTimeout time.Duration
	// TailScanLimit bounds, per Kafka partition, how many records the
	// target reads back to find the last record of an outbox partition
	// when it (re)gains it (default 100,000). With equal partition counts
	// the last record is at the very end; with unequal counts it may be
	// further back, and past this limit a message may be sent twice.
	TailScanLimit int
}

// DefaultSaramaConfig returns the client configuration of a KafkaTarget:
// sarama's defaults with
//   - Producer.Partitioner = NewMurmur2Partitioner, Kafka's default
//     partitioner and the outbox's: a key lands on the same partition number
//     in both when the partition counts are equal;
//   - Producer.RequiredAcks = WaitForAll;
//   - network timeouts of 5 s (dial) and 10 s (read, write) and short
//     metadata retries, so that a send to an unreachable cluster fails well
//     within the partition's lease.
func DefaultSaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = "watermill-outbox-forwarder"
	c.Producer.Partitioner = NewMurmur2Partitioner
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	c.Net.DialTimeout = 5 * time.Second
	c.Net.ReadTimeout = 10 * time.Second
	c.Net.WriteTimeout = 10 * time.Second
	c.Metadata.Retry.Max = 1
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	return c
}

func (c *KafkaConfig) setDefaults() {
	if c.Sarama == nil {
		c.Sarama = DefaultSaramaConfig()
	}
	if c.Marshaler == nil {
		c.Marshaler = kafka.DefaultMarshaler{}
	}
	if c.Key == nil {
		c.Key = func(msg *message.Message) []byte {
			if k := PartitionKey(msg); k != "" {
				return []byte(k)
			}
			return nil
		}
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	if c.TransactionalIDPrefix == "" {
		c.TransactionalIDPrefix = "watermill-outbox"
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = time.Minute
	}
	if c.TailScanLimit == 0 {
		c.TailScanLimit = 100_000
	}
}

// Validate reports the first impossible setting.
func (c KafkaConfig) Validate() error {
	c.setDefaults()
	if len(c.Brokers) == 0 {
		return &outbox.ConfigError{Field: "Brokers", Reason: "required"}
	}
	if err := c.Sarama.Validate(); err != nil {
		return &outbox.ConfigError{Field: "Sarama", Reason: err.Error()}
	}
	switch {
	case !c.Sarama.Version.IsAtLeast(sarama.V0_11_0_0):
		return &outbox.ConfigError{Field: "Sarama.Version", Reason: "must be at least 0.11 (record batches with headers)"}
	case c.Sarama.Producer.Partitioner == nil || sameFunc(c.Sarama.Producer.Partitioner, sarama.NewHashPartitioner):
		return &outbox.ConfigError{Field: "Sarama.Producer.Partitioner", Reason: "sarama's default hash partitioner (FNV-1a) places keys unlike the outbox and Kafka's Java client: use forwarder.NewMurmur2Partitioner (see DefaultSaramaConfig)"}
	case c.Sarama.Producer.RequiredAcks == sarama.NoResponse:
		return &outbox.ConfigError{Field: "Sarama.Producer.RequiredAcks", Reason: "NoResponse cannot confirm a message"}
	case c.AtLeastOnce:
	case c.Sarama.Producer.RequiredAcks != sarama.WaitForAll:
		return &outbox.ConfigError{Field: "Sarama.Producer.RequiredAcks", Reason: "Kafka transactions (exactly-once delivery) need WaitForAll; or set AtLeastOnce"}
	case c.TransactionTimeout < time.Second:
		return &outbox.ConfigError{Field: "TransactionTimeout", Reason: "must be at least a second"}
	case c.TailScanLimit < 0:
		return &outbox.ConfigError{Field: "TailScanLimit", Reason: "must be positive"}
	}
	return nil
}

func sameFunc(a, b any) bool { return reflect.ValueOf(a).Pointer() == reflect.ValueOf(b).Pointer() }

// KafkaTarget publishes to Kafka through a sarama client. Records are built
// by watermill-kafka's Marshaler, keyed by the outbox partition key and
// placed by murmur2 (Producer.Partitioner).
//
// A batch goes to Kafka in one produce request per leader broker, holding
// one record batch per partition: Kafka appends a partition's record batch
// entirely or not at all, so when a send fails, no record of a partition
// is stored after a record of that partition that was not. This is what
// keeps per-key order through broker failures; a sarama SyncProducer cannot
// promise it (its pipeline splits a partition's messages over several
// requests, and once its retries give up on one of them, those behind it
// may still be stored). A batch larger than Producer.MaxMessageBytes in a
// partition is sent in several requests, one after the other.
//
// By default each batch is one Kafka transaction, exactly once: see
// KafkaConfig.AtLeastOnce and kafka_txn.go. A failed send then aborts its
// transaction and nothing of it is visible to read_committed consumers.
// At least once, when partitions fail, Send reports the prefix of the
// batch before the first record of a failed partition as done; records
// after it that did arrive (in other partitions) are sent again:
// duplicates, each with the stable id in header outbox_id. Errors that no retry can cure take the
// message out of the stream with outbox.Reject: a marshal failure, a record
// larger than Producer.MaxMessageBytes, an invalid topic, and a broker's
// MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE or INVALID_RECORD for a record
// alone in its partition's record batch. When the broker refuses a record
// batch of several records with one of these, the same Send sends the
// refused records again in halves until the record to blame is alone: the
// records before it are delivered, it is rejected (on its first attempt),
// and records the halving requests had already stored in other partitions
// are not sent again by this Send. All else (broker down, leader
// elections, timeouts, not enough replicas) is a transient error, retried
// with backoff.
type KafkaTarget struct {
	cfg    KafkaConfig
	logger watermill.LoggerAdapter

	mu           sync.Mutex
	client       sarama.Client
	closed       bool
	partitioners map[string]*lockedPartitioner
	// refused is, per topic, the smallest record batch the broker refused
	// as too large when it held a single record: a record at least that
	// large is refused without being sent (until refusedFor has passed,
	// in case the broker's limit is raised).
	refused map[string]refusedSize
	// producers are the transactional producers, by transactional id.
	producers map[string]*txnProducer

	// Seams for the tests of exactly-once delivery: beforeCommit runs
	// before a transaction commits, noTailRead skips reading the tail.
	beforeCommit func()
	noTailRead   bool
}

// CheckKeyIsolation refuses key isolation (outbox.KeyIsolation) with
// exactly-once delivery: a held message is sent after newer ones, and the
// tail read of the next owner (kafka_txn.go) would take it for one already
// written and skip it.
func (t *KafkaTarget) CheckKeyIsolation() error {
	if t.cfg.AtLeastOnce {
		return nil
	}
	return &outbox.ConfigError{Field: "Subscriber.KeyIsolation", Reason: "cannot be combined with exactly-once delivery into Kafka, which needs each partition's messages in seq order; set KafkaConfig.AtLeastOnce (consumers then dedup by outbox_id, e.g. with the inbox) or leave isolation off"}
}

type refusedSize struct {
	bytes int
	at    time.Time
}

// refusedFor is how long a size the broker refused is remembered.
const refusedFor = time.Minute

// refusedAt returns the smallest single-record batch size the broker
// refused for topic recently (0: none).
func (t *KafkaTarget) refusedAt(topic string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.refused[topic]
	if !ok || time.Since(r.at) > refusedFor {
		return 0
	}
	return r.bytes
}

func (t *KafkaTarget) noteRefused(topic string, bytes int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refused == nil {
		t.refused = map[string]refusedSize{}
	}
	if r, ok := t.refused[topic]; !ok || bytes < r.bytes || time.Since(r.at) > refusedFor {
		t.refused[topic] = refusedSize{bytes: bytes, at: time.Now()}
	}
}

type lockedPartitioner struct {
	mu sync.Mutex
	p  sarama.Partitioner
}

// NewKafkaTarget creates a KafkaTarget. It connects on the first Send, so
// that a forwarder can start while Kafka is unreachable.
func NewKafkaTarget(cfg KafkaConfig) (*KafkaTarget, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &KafkaTarget{
		cfg:          cfg,
		logger:       cfg.Logger.With(watermill.LogFields{"component": "outbox.forwarder.kafka"}),
		partitioners: map[string]*lockedPartitioner{},
	}, nil
}

func (t *KafkaTarget) connect() (sarama.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, outbox.ErrClosed
	}
	if t.client == nil {
		c, err := sarama.NewClient(t.cfg.Brokers, t.cfg.Sarama)
		if err != nil {
			return nil, fmt.Errorf("cannot connect: %w", err)
		}
		t.client = c
	}
	return t.client, nil
}

func (t *KafkaTarget) partitioner(topic string) *lockedPartitioner {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.partitioners[topic]
	if p == nil {
		p = &lockedPartitioner{p: t.cfg.Sarama.Producer.Partitioner(topic)}
		t.partitioners[topic] = p
	}
	return p
}

// Close closes the client. Sends in flight fail.
func (t *KafkaTarget) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	if t.client != nil {
		return t.client.Close()
	}
	return nil
}

// outRecord is one message of a batch on its way to Kafka.
type outRecord struct {
	index     int // in the batch
	partition int32
	record    *sarama.Record
	size      int // upper bound of its encoded size
}

// recordInfo rides along in sarama.ProducerMessage.Metadata for the
// partitioner.
type recordInfo struct {
	outboxPartition int // -1 when unknown
}

// OutboxPartition is the partition the record's message had in the outbox.
func (r recordInfo) OutboxPartition() int { return r.outboxPartition }

// Send implements Target.
func (t *KafkaTarget) Send(ctx context.Context, topic string, batch []*message.Message) (int, error) {
	if t.partitioners == nil {
		return 0, errs.NotConstructed("forwarder.KafkaTarget", "forwarder.NewKafkaTarget")
	}
	if err := checkBatch(batch); err != nil {
		return 0, err
	}
	if len(batch) == 0 {
		return 0, nil
	}
	client, err := t.connect()
	if err != nil {
		return 0, fmt.Errorf("forwarder: kafka: %w", err)
	}
	partitions, err := client.Partitions(topic)
	if err != nil {
		if errors.Is(err, sarama.ErrInvalidTopic) {
			return 0, t.reject(batch[0], err)
		}
		return 0, fmt.Errorf("forwarder: kafka: partitions of %s: %w", topic, err)
	}
	if !t.cfg.AtLeastOnce {
		return t.sendExactlyOnce(ctx, client, topic, partitions, batch)
	}
	part := t.partitioner(topic)
	maxBytes := t.cfg.Sarama.Producer.MaxMessageBytes
	records := make([]outRecord, 0, len(batch))
	var bad error // why batch[len(records)] cannot be sent
	// With compression the broker judges compressed sizes: a record as
	// large as one it refused may still fit, so nothing is learned then.
	learn := t.cfg.Sarama.Producer.Compression == sarama.CompressionNone
	refusedAt := 0
	if learn {
		refusedAt = t.refusedAt(topic)
	}
	for i, msg := range batch {
		r, err := t.record(topic, msg, part, int32(len(partitions)))
		switch {
		case err != nil:
		case r.size+recordBatchOverhead > maxBytes:
			err = fmt.Errorf("record of %d bytes is larger than Producer.MaxMessageBytes (%d): %w", r.size, maxBytes, sarama.ErrMessageSizeTooLarge)
		case refusedAt > 0 && r.size+recordBatchOverhead >= refusedAt:
			err = fmt.Errorf("record of %d bytes: the broker refused a record of %d bytes as too large (its message.max.bytes) within the last %v: %w",
				r.size, refusedAt-recordBatchOverhead, refusedFor, sarama.ErrMessageSizeTooLarge)
		}
		if err != nil {
			bad = err
			break
		}
		r.index = i
		records = append(records, r)
	}
	// limit caps the records of a chunk once the broker refused a record
	// batch of several records as too large: one of them is to blame, and
	// halving the chunk finds it within this Send (a few more requests),
	// so that it is rejected on its first attempt while the records
	// before it are delivered, instead of the whole batch failing and the
	// partition backing off until adaptive batching isolates it.
	//
	// sent marks the records stored so far. A refused request may have
	// stored the record batches of its other partitions, records behind
	// the refused one among them: they are left out of the smaller chunks
	// that follow, so that this Send stores no record twice.
	limit := 0
	sent := make([]bool, len(records))
	pending := make([]outRecord, 0, len(records))
	for start := 0; start < len(records); {
		pending = pending[:0]
		for _, r := range records[start:] {
			if !sent[r.index] {
				pending = append(pending, r)
			}
		}
		end := chunkEnd(pending, 0, maxBytes)
		if limit > 0 && end > limit {
			end = limit
		}
		chunk := pending[:end]
		done, stored, err := t.produce(ctx, client, topic, chunk, nil)
		for _, r := range chunk {
			if stored[r.partition] {
				sent[r.index] = true
			}
		}
		if done < len(chunk) {
			i := chunk[done].index
			var perm *permanentError
			if errors.As(err, &perm) {
				if learn && (errors.Is(perm.err, sarama.ErrMessageSizeTooLarge) || errors.Is(perm.err, sarama.ErrMessageSetSizeTooLarge)) {
					t.noteRefused(topic, records[i].size+recordBatchOverhead)
				}
				return i, t.reject(batch[i], perm.err)
			}
			var refused *refusedSetError
			if errors.As(err, &refused) && ctx.Err() == nil {
				t.logger.Debug("Kafka refused a record batch: splitting it to find the record to blame", watermill.LogFields{
					"id": batch[i].Metadata.Get(outbox.MetadataID), "records": refused.records, "err": refused.err.Error(),
				})
				start, limit = i, max(1, refused.records/2)
				continue
			}
			return i, err
		}
		for start < len(records) && sent[start] {
			start++
		}
	}
	if bad != nil {
		return len(records), t.reject(batch[len(records)], bad)
	}
	return len(batch), nil
}

func (t *KafkaTarget) reject(msg *message.Message, cause error) error {
	t.logger.Error("Kafka cannot take the message, ever: rejecting it", cause, watermill.LogFields{"id": msg.Metadata.Get(outbox.MetadataID)})
	return outbox.Reject(msg, fmt.Errorf("kafka: %w", cause))
}

// Bounds of the encoded sizes, as sarama's producer computes them.
const (
	recordBatchOverhead   = 61
	maximumRecordOverhead = 5*binary.MaxVarintLen32 + binary.MaxVarintLen64 + 1
)

func (t *KafkaTarget) record(topic string, msg *message.Message, part *lockedPartitioner, partitions int32) (outRecord, error) {
	pm, err := t.cfg.Marshaler.Marshal(topic, Outgoing(msg))
	if err != nil {
		return outRecord{}, fmt.Errorf("marshal message %s: %w", msg.UUID, err)
	}
	if key := t.cfg.Key(msg); len(key) > 0 {
		pm.Key = sarama.ByteEncoder(key)
	}
	pm.Metadata = recordInfo{outboxPartition: outboxPartition(msg)}
	r := &sarama.Record{}
	if pm.Key != nil {
		if r.Key, err = pm.Key.Encode(); err != nil {
			return outRecord{}, fmt.Errorf("encode key of message %s: %w", msg.UUID, err)
		}
	}
	if pm.Value != nil {
		if r.Value, err = pm.Value.Encode(); err != nil {
			return outRecord{}, fmt.Errorf("encode value of message %s: %w", msg.UUID, err)
		}
	}
	size := maximumRecordOverhead + len(r.Key) + len(r.Value)
	r.Headers = make([]*sarama.RecordHeader, len(pm.Headers), len(pm.Headers)+2)
	for i := range pm.Headers {
		r.Headers[i] = &pm.Headers[i]
	}
	if !t.cfg.AtLeastOnce {
		// The tail read after a takeover finds the partition's last record
		// by these, whatever the Marshaler writes.
		r.Headers = ensureHeader(r.Headers, outbox.MetadataID, msg.Metadata.Get(outbox.MetadataID))
		r.Headers = ensureHeader(r.Headers, outbox.MetadataIncarnation, msg.Metadata.Get(outbox.MetadataIncarnation))
	}
	for _, h := range r.Headers {
		size += len(h.Key) + len(h.Value) + 2*binary.MaxVarintLen32
	}
	part.mu.Lock()
	p, err := part.p.Partition(pm, partitions)
	part.mu.Unlock()
	if err != nil {
		return outRecord{}, fmt.Errorf("partition message %s: %w", msg.UUID, err)
	}
	if p < 0 || p >= partitions {
		return outRecord{}, fmt.Errorf("partitioner chose partition %d of %d for message %s", p, partitions, msg.UUID)
	}
	return outRecord{partition: p, record: r, size: size}, nil
}

// ensureHeader adds header key with value unless headers hold it (or value
// is empty).
func ensureHeader(headers []*sarama.RecordHeader, key, value string) []*sarama.RecordHeader {
	if value == "" {
		return headers
	}
	for _, h := range headers {
		if string(h.Key) == key {
			return headers
		}
	}
	return append(headers, &sarama.RecordHeader{Key: []byte(key), Value: []byte(value)})
}

// chunkEnd returns the end of the chunk of records that starts at start:
// as many records as fit MaxMessageBytes in every partition, at least one.
func chunkEnd(records []outRecord, start, maxBytes int) int {
	sizes := map[int32]int{}
	for i := start; i < len(records); i++ {
		r := records[i]
		if sizes[r.partition] == 0 {
			sizes[r.partition] = recordBatchOverhead
		}
		if i > start && sizes[r.partition]+r.size > maxBytes {
			return i
		}
		sizes[r.partition] += r.size
	}
	return len(records)
}

func outboxPartition(msg *message.Message) int {
	p, err := strconv.Atoi(msg.Metadata.Get(outbox.MetadataPartition))
	if err != nil {
		return -1
	}
	return p
}

// produce sends chunk in one produce request per leader broker, one record
// batch per partition, and returns how many records from the start of
// chunk are stored (those before the first record of a failed partition)
// and the partitions whose record batch was stored. With txn, the records
// are written in txn's open transaction.
func (t *KafkaTarget) produce(ctx context.Context, client sarama.Client, topic string, chunk []outRecord, txn *txnProducer) (int, map[int32]bool, error) {
	type partSet struct {
		first   int // position in chunk of its first record
		records []*sarama.Record
		err     error // nil once stored
	}
	sets := map[int32]*partSet{}
	var order []int32
	for i, r := range chunk {
		s := sets[r.partition]
		if s == nil {
			s = &partSet{first: i, err: errNoAnswer}
			sets[r.partition] = s
			order = append(order, r.partition)
		}
		s.records = append(s.records, r.record)
	}
	requests := map[*sarama.Broker]*sarama.ProduceRequest{}
	members := map[*sarama.Broker][]int32{}
	refresh := false
	for _, p := range order {
		leader, err := client.Leader(topic, p)
		if err != nil {
			sets[p].err, refresh = err, true
			continue
		}
		req := requests[leader]
		if req == nil {
			req = t.newRequest(txn)
			requests[leader] = req
		}
		req.AddBatch(topic, p, t.newBatch(sets[p].records, txn, p))
		members[leader] = append(members[leader], p)
	}

	type answer struct {
		broker *sarama.Broker
		resp   *sarama.ProduceResponse
		err    error
	}
	answers := make(chan answer, len(requests))
	for b, req := range requests {
		go func() {
			resp, err := b.Produce(req)
			answers <- answer{b, resp, err}
		}()
	}
	var ctxErr error
wait:
	for range requests {
		select {
		case a := <-answers:
			for _, p := range members[a.broker] {
				s := sets[p]
				switch {
				case a.err != nil:
					s.err = a.err
				case a.resp == nil:
					s.err = nil // acks = 0 (validated away)
				default:
					block := a.resp.GetBlock(topic, p)
					switch {
					case block == nil:
						s.err = sarama.ErrIncompleteResponse
					case block.Err != sarama.ErrNoError:
						s.err = block.Err
					default:
						s.err = nil
					}
				}
			}
			if a.err != nil {
				// The connection is broken or out of sync: reconnect on the
				// next send.
				_ = a.broker.Close()
				refresh = true
			}
		case <-ctx.Done():
			ctxErr = fmt.Errorf("no answer in time: %w", context.Cause(ctx))
			break wait
		}
	}

	failed, cause := len(chunk), error(nil)
	stored := make(map[int32]bool, len(order))
	for _, p := range order {
		s := sets[p]
		if s.err == nil {
			stored[p] = true
			continue
		}
		if retriableAfterRefresh(s.err) {
			refresh = true
		}
		if s.first < failed {
			failed, cause = s.first, s.err
		}
	}
	if refresh {
		_ = client.RefreshMetadata(topic)
	}
	if failed == len(chunk) {
		return failed, stored, nil
	}
	if cause == errNoAnswer && ctxErr != nil {
		cause = ctxErr
	}
	setSize := len(sets[chunk[failed].partition].records)
	if permanentKafkaError(cause, setSize) {
		return failed, stored, &permanentError{cause}
	}
	if setSize > 1 && refusedForSize(cause) {
		return failed, stored, &refusedSetError{records: setSize, err: fmt.Errorf("forwarder: kafka: partition %d of %s: %w", chunk[failed].partition, topic, cause)}
	}
	return failed, stored, fmt.Errorf("forwarder: kafka: partition %d of %s: %w", chunk[failed].partition, topic, cause)
}

var errNoAnswer = errors.New("no answer from the broker")

func (t *KafkaTarget) newRequest(txn *txnProducer) *sarama.ProduceRequest {
	c := t.cfg.Sarama
	req := &sarama.ProduceRequest{
		RequiredAcks: c.Producer.RequiredAcks,
		Timeout:      int32(c.Producer.Timeout / time.Millisecond),
		Version:      3,
	}
	if txn != nil {
		req.TransactionalID = &txn.id
	}
	// As sarama's producer picks it.
	switch {
	case c.Version.IsAtLeast(sarama.V2_4_0_0):
		req.Version = 8
	case c.Version.IsAtLeast(sarama.V2_1_0_0):
		req.Version = 7
	case c.Version.IsAtLeast(sarama.V2_0_0_0):
		req.Version = 6
	case c.Version.IsAtLeast(sarama.V1_0_0_0):
		req.Version = 5
	}
	return req
}

func (t *KafkaTarget) newBatch(records []*sarama.Record, txn *txnProducer, partition int32) *sarama.RecordBatch {
	now := time.Now().Truncate(time.Millisecond)
	for i, r := range records {
		r.OffsetDelta = int64(i)
	}
	if txn != nil {
		return &sarama.RecordBatch{
			Version:          2,
			FirstTimestamp:   now,
			MaxTimestamp:     now,
			Codec:            t.cfg.Sarama.Producer.Compression,
			CompressionLevel: t.cfg.Sarama.Producer.CompressionLevel,
			ProducerID:       txn.producerID,
			ProducerEpoch:    txn.epoch,
			FirstSequence:    txn.sequences[partition],
			IsTransactional:  true,
			LastOffsetDelta:  int32(len(records) - 1),
			Records:          records,
		}
	}
	return &sarama.RecordBatch{
		Version:          2,
		FirstTimestamp:   now,
		MaxTimestamp:     now,
		Codec:            t.cfg.Sarama.Producer.Compression,
		CompressionLevel: t.cfg.Sarama.Producer.CompressionLevel,
		ProducerID:       -1, // not idempotent
		ProducerEpoch:    -1,
		FirstSequence:    -1,
		LastOffsetDelta:  int32(len(records) - 1),
		Records:          records,
	}
}

// retriableAfterRefresh says whether err suggests stale metadata.
func retriableAfterRefresh(err error) bool {
	var kerr sarama.KError
	if errors.As(err, &kerr) {
		switch kerr {
		case sarama.ErrNotLeaderForPartition, sarama.ErrLeaderNotAvailable, sarama.ErrUnknownTopicOrPartition,
			sarama.ErrFencedLeaderEpoch, sarama.ErrUnknownLeaderEpoch:
			return true
		}
	}
	return false
}

// refusedSetError reports a record batch of several records that the broker
// refused as a whole because of its size or one bad record: smaller batches
// find the record to blame.
type refusedSetError struct {
	records int
	err     error
}

func (e *refusedSetError) Error() string { return e.err.Error() }
func (e *refusedSetError) Unwrap() error { return e.err }

// refusedForSize says whether err is the broker judging a record batch as
// too large or invalid, for one of its records.
func refusedForSize(err error) bool {
	var kerr sarama.KError
	if errors.As(err, &kerr) {
		switch kerr {
		case sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSetSizeTooLarge, sarama.ErrInvalidRecord:
			return true
		}
	}
	return false
}

// permanentKafkaError says whether a partition's error means its first
// record can never be published; setSize is the number of records of its
// record batch.
func permanentKafkaError(err error, setSize int) bool {
	var kerr sarama.KError
	if errors.As(err, &kerr) {
		switch kerr {
		case sarama.ErrInvalidTopic:
			return true
		case sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSetSizeTooLarge, sarama.ErrInvalidRecord:
			// The broker judged the whole record batch: the record is to
			// blame only when it was alone in it.
			return setSize == 1
		}
	}
	return false
}

// Murmur2Partitioner is a sarama.Partitioner that places keyed records as
// Kafka's default partitioner (and franz-go's, and the outbox) does:
// toPositive(murmur2(key)) % partitions. With the same partition count, a
// key lands on the same partition number in Kafka as in the outbox. A
// record without key goes to the partition number its message had in the
// outbox, modulo the partition count, so keyless messages keep the order
// they had there; without that information, round-robin.
type Murmur2Partitioner struct {
	next int32
}

// NewMurmur2Partitioner is a sarama.PartitionerConstructor for
// Murmur2Partitioner.
func NewMurmur2Partitioner(string) sarama.Partitioner { return &Murmur2Partitioner{} }

// Partition implements sarama.Partitioner.
func (p *Murmur2Partitioner) Partition(msg *sarama.ProducerMessage, numPartitions int32) (int32, error) {
	if numPartitions <= 0 {
		return 0, fmt.Errorf("%w: forwarder: %d partitions", outbox.ErrInvalidPartitionCount, numPartitions)
	}
	if msg == nil {
		return 0, errs.NilArgument("forwarder.Murmur2Partitioner.Partition: msg", "pass the record to place")
	}
	if msg.Key == nil {
		if op, ok := msg.Metadata.(interface{ OutboxPartition() int }); ok && op.OutboxPartition() >= 0 {
			return int32(op.OutboxPartition() % int(numPartitions)), nil
		}
		p.next = (p.next + 1) % numPartitions
		return p.next, nil
	}
	key, err := msg.Key.Encode()
	if err != nil {
		return 0, err
	}
	return (partitioning.Murmur2Hash(key) & 0x7fffffff) % numPartitions, nil
}

// RequiresConsistency implements sarama.Partitioner: a key always maps to
// the same partition.
func (p *Murmur2Partitioner) RequiresConsistency() bool { return true }
