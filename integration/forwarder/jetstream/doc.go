// Package jetstream holds the tests of package forwarder/jetstream that
// need a NATS server (an embedded nats-server with JetStream) and a
// PostgreSQL outbox: exactly once in key order through an instance's crash
// and a server restart, waiting for the stream, and the messages the
// stream refuses for good rejected on their first attempt.
//
// The package has no code of its own.
package jetstream
