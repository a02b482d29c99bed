// Package sim pins the deterministic simulator's models (internal/sim) to
// what they stand for: the same scenarios run through the Kafka model and
// through the product's kgo driver against kfake (or the cluster of
// OUTBOX_TEST_KAFKA_BROKERS), and through the database model and
// PostgreSQL's statements (lease.Store, consumer.Store), and the
// transcripts must be equal.
package sim
