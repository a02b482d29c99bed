// Package kafkadriver is the seam between the Kafka target's logic
// (package forwarder/kafka: fencing, the tail read, skipping by seq,
// halving a refused batch, rejecting) and the Kafka client it runs on.
// The product runs it on franz-go's kgo ([NewKgo]); the deterministic
// simulator (internal/sim) runs it on a model of Kafka, pinned to kgo and
// kfake by the tests of integration/sim, which run the same scenarios
// through both drivers. Everything the target knows about Kafka goes
// through these interfaces, and nothing else: a driver is all a model
// must get right.
package kafkadriver

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Driver is a Kafka client as the target uses it: the requests of a
// shared admin client, and producers of its own.
type Driver interface {
	// Compressed reports whether produced record batches are compressed
	// (the broker then judges compressed sizes).
	Compressed() bool
	// TopicPartitions returns the partition count of topic; exists is
	// false when the cluster does not know the topic.
	TopicPartitions(ctx context.Context, topic string) (n int, exists bool, err error)
	// CreateTopic creates topic with partitions partitions and the
	// brokers' default replication factor; an error matching
	// kerr.TopicAlreadyExists when another was first.
	CreateTopic(ctx context.Context, topic string, partitions int) error
	// Offsets returns, for every partition of topic, its log start
	// offset and its end offset (the high watermark: the next record's
	// offset).
	Offsets(ctx context.Context, topic string) (map[int32]PartitionOffsets, error)
	// ReadLog returns what a read_uncommitted consumer reads among the
	// offsets [from, end) of partition of topic, transaction markers
	// included, in offset order. end is at most the partition's end
	// offset.
	ReadLog(ctx context.Context, topic string, partition int32, from, end int64) ([]LogRecord, error)
	// Transactional returns a new producer of transactional id id, not
	// initialised yet.
	Transactional(id string) (Transactional, error)
	// Idempotent returns a new idempotent producer that sends only when
	// flushed.
	Idempotent() (Idempotent, error)
	// Close closes the shared client.
	Close()
}

// PartitionOffsets are a partition's log start and end offsets.
type PartitionOffsets struct {
	Start, End int64
}

// LogRecord is a record of a partition's log as a read_uncommitted
// consumer reads it: a record (Offset, ProducerID, Key, Value, Headers are
// set) or a transaction marker, which ends the open transaction of its
// ProducerID in the partition: committed (Commit) or aborted.
type LogRecord struct {
	*kgo.Record
	// Transactional: the record was written in a transaction, whose
	// marker comes later.
	Transactional bool
	// Marker: the record is a transaction marker (a control record).
	Marker bool
	// Commit: the marker commits its transaction (else it aborts it).
	Commit bool
}

// Transactional is a transactional producer: one transactional id, one
// transaction at a time.
type Transactional interface {
	// Init runs InitProducerId: from then on the broker refuses every
	// earlier producer of the transactional id (fenced), and a
	// transaction one of them left open is aborted.
	Init(ctx context.Context) error
	// Begin starts a transaction.
	Begin() error
	// Produce hands records to the producer, in order, and waits until
	// the broker answered for each of them or ctx ended: errs[i] is
	// records[i]'s error (nil: written into the transaction); finished is
	// false when ctx ended first (the records without an answer may still
	// be written). Each record's Partition is set to where it went.
	Produce(ctx context.Context, records []*kgo.Record) (errs []error, finished bool)
	// End ends the transaction: commits it (commit true) or aborts it.
	// Committed is true only when the driver knows the broker committed
	// the transaction: a nil error alone does not say so (kgo's
	// EndTransaction can end a transaction it was asked to commit with an
	// abort and return nil); without that knowledge the caller treats the
	// transaction as not committed, and its next producer's tail read
	// decides what Kafka holds.
	End(ctx context.Context, commit bool) (committed bool, err error)
	// Close closes the producer; a transaction left open is aborted by
	// the broker (its timeout, or the next Init of the id).
	Close()
}

// Idempotent is a producer without transactions whose records are sent
// when it is flushed.
type Idempotent interface {
	// Capacity is how many records it buffers: a try hands it at most
	// these.
	Capacity() int
	// ProduceFlush hands records to the producer, flushes, and waits as
	// Transactional.Produce does.
	ProduceFlush(ctx context.Context, records []*kgo.Record) (errs []error, finished bool)
	// Close closes the producer.
	Close()
}

// Factory makes a Target's driver; the logger is the target's.
type Factory func(logger watermill.LoggerAdapter) (Driver, error)

// Target is a Kafka target (package forwarder/kafka) as the simulator
// drives it.
type Target interface {
	Send(ctx context.Context, topic string, batch []*message.Message) (done int, err error)
	Close() error
}

// NewTarget makes a Kafka target of cfg (a kafka.Config) on the drivers
// newDriver makes. Package forwarder/kafka sets it as it initialises; the
// simulator (internal/sim), which imports that package, calls it. It is
// not part of the product's API.
// instance names the target's exactly-once producer (its transactional
// id is "<prefix>/<instance>"; "": a random one).
var NewTarget func(cfg any, logger watermill.LoggerAdapter, newDriver Factory, instance string) (Target, error)
