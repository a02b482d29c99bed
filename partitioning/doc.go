// Package partitioning maps a message's partition key to a partition of its
// topic.
//
// The default [Partitioner], returned by [Default], is [Murmur2]. It places a
// key exactly where Kafka's default partitioner places a record with the same
// key bytes:
//
//  1. hash the key's bytes with Kafka's variant of MurmurHash2 (32-bit,
//     seed 0x9747b28c), exposed as [Murmur2Hash];
//  2. make the hash non-negative with Kafka's toPositive, h & 0x7fffffff
//     (the sign bit is masked off, not negated);
//  3. take that value modulo the number of partitions.
//
// This is the arithmetic of the Java client's Utils.murmur2 and
// Utils.toPositive, and of franz-go's kgo.StickyKeyPartitioner(nil) for keyed
// records. Consequently, when the outbox and a Kafka topic have the same
// number of partitions, a key lands on the same partition number in both, so
// per-key ordering established in the outbox carries over to Kafka consumers.
// Changing the partition count remaps keys, in the outbox as in Kafka.
//
// Partition counts must lie in [MinPartitions, MaxPartitions]; anything else
// yields an error matching outbox.ErrInvalidPartitionCount.
//
// Keyless messages are not the partitioner's concern: the publisher spreads
// them round-robin, so they carry no ordering guarantee relative to each
// other. A partitioner still returns a valid, deterministic partition for the
// empty key (Kafka hashes an empty, non-null key the same way).
package partitioning
