package outbox

import "github.com/millrace/watermill-outbox/internal/consumer"

// Metadata the Subscriber sets on every message it delivers.
const (
	// MetadataTopic is the outbox topic the message was read from.
	MetadataTopic = consumer.MetadataTopic
	// MetadataPartition is its partition.
	MetadataPartition = consumer.MetadataPartition
	// MetadataSeq is its gap-free sequence number within the partition.
	MetadataSeq = consumer.MetadataSeq
	// MetadataAttempt counts deliveries of this message to this consumer
	// group, starting at 1.
	MetadataAttempt = consumer.MetadataAttempt
	// MetadataPartitionKey is the message's partition key, when it has one,
	// however the Publisher was given it (the forwarder uses it as the Kafka
	// record key). A publisher reads the key from
	// PublishPartitionKeyMetadata instead.
	MetadataPartitionKey = consumer.MetadataPartitionKey
	// MetadataID is the message's stable id, "topic/partition/seq": the same
	// on every redelivery, so consumers can drop duplicates by it.
	MetadataID = consumer.MetadataID
	// MetadataIncarnation identifies the incarnation of the topic (its
	// registration time, µs since the Unix epoch): a topic dropped and
	// registered again numbers its messages from 1 again, under a new
	// incarnation. Package inbox uses it to tell a new stream from a
	// replay of an old one.
	MetadataIncarnation = consumer.MetadataIncarnation
	// MetadataPublishedAt is when the message was published: the
	// statement that wrote it (the table mode), or its transaction's
	// commit (the log-based mode); RFC 3339 with nanoseconds, UTC. With
	// MetadataSequencedAt it says where a message's latency went.
	MetadataPublishedAt = consumer.MetadataPublishedAt
	// MetadataSequencedAt is when the message was given its seq (by the
	// sequencer, or the relay), in the same form.
	MetadataSequencedAt = consumer.MetadataSequencedAt
)

// MetadataSource names the source (the database) a forwarded message was
// read from, when the Forwarder has one (forwarder.Config.Source, every
// source of a pipeline.Fleet). It is set by the forwarder, not the
// Subscriber: two databases number their messages alike, so across
// sources a message is told apart by (MetadataSource, MetadataID).
const MetadataSource = "outbox_source"

// StableID returns the stable id of the message at seq in partition of topic.
func StableID(topic string, partition int, seq int64) string {
	return consumer.StableID(topic, partition, seq)
}
