// Package forwarder holds the tests of package forwarder that need a
// broker (a Kafka cluster: kfake in process, or the real one of
// OUTBOX_TEST_KAFKA_BROKERS; see integration/internal/kafkatest) and a
// PostgreSQL outbox: Watermill middleware on the forwarder's traffic, key
// isolation, outboxtest driving the Forwarder's handler, the trace context
// reaching the records, a refused record isolated within the send, and the
// cost of poison (BenchmarkForwarderPoison). The targets' own tests are in
// integration/forwarder/kafka and integration/forwarder/jetstream.
//
// The package has no code of its own.
package forwarder
