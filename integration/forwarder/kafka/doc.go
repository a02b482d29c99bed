// Package kafka holds the tests of package forwarder/kafka, which need a
// Kafka cluster (kfake in process, or the real one of
// OUTBOX_TEST_KAFKA_BROKERS; see integration/internal/kafkatest) and a
// PostgreSQL outbox: every message in key order on the partition number
// of its outbox partition, a broker outage, failed produce requests, an
// instance killed in the middle of a batch, a zombie fenced, a committed
// batch not sent again, records the broker refuses isolated within the
// send, what one instance holds open at 64 partitions, and records of
// topics with a schema (package schema) decoded by an ordinary consumer
// with franz-go's sr.Serde.
//
// The package has no code of its own.
package kafka
