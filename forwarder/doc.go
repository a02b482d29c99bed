// Package forwarder relays the messages of a PostgreSQL outbox to a
// message broker: Kafka (the target of package forwarder/kafka, on
// franz-go, with watermill-kafka's record format), NATS JetStream (package
// forwarder/jetstream, with watermill-nats's message format), or any
// Watermill message.Publisher (PublisherTarget). Each broker's target is a
// package of its own, so that an application links only the client of the
// broker it forwards to.
//
// A Forwarder reads outbox topics as a consumer group (outbox.Subscriber's
// ConsumeBatches): any number of instances share the partitions, each
// partition is read by one instance at a time, in seq order, in batches.
// Each batch goes to the broker in one go (one produce request per Kafka
// broker, asynchronous JetStream publishes awaited together, one Publish
// call), and the group's cursor moves past the part of the batch the broker
// confirmed, once per batch. So:
//
//   - nothing committed to the outbox is lost: a message leaves the outbox
//     stream only when the broker confirmed it, or when it is rejected as
//     poison (it then goes to the Subscriber's RejectHandler, e.g. a
//     dead-letter table);
//   - per-key order carries over: messages with the same partition key share
//     an outbox partition, are sent in seq order and, on Kafka, share a
//     partition again (murmur2, like Kafka's own partitioner);
//   - into Kafka, exactly once by default: the Kafka target writes each
//     batch in a Kafka transaction of a transactional producer per outbox
//     partition (a new owner fences the previous one, zombies included) and,
//     on taking a partition over, reads back what it already wrote and skips
//     it; consumers read with isolation level read_committed (see the
//     AtLeastOnce field of package forwarder/kafka's Config);
//   - elsewhere, messages can be duplicated (at-least-once): what was sent
//     but not confirmed, or confirmed after the forwarder's lease ended, is
//     sent again. Every copy carries the same stable id, outbox.MetadataID
//     ("topic/partition/seq"), as metadata (Kafka header, NATS header), and
//     on JetStream it is the Nats-Msg-Id, so the server drops copies within
//     the stream's duplicate window. Package inbox gives consumers
//     exactly-once effects behind any target.
//
// A broker outage only stalls the forwarder: failed sends are retried with
// backoff (the outbox.Subscriber's Tuning) until the broker is back.
//
//	target, _ := kafka.NewTarget(kafka.Config{Brokers: brokers}, logger) // package forwarder/kafka
//	defer target.Close()
//	fwd, _ := forwarder.NewForwarder(forwarder.Config{
//		Subscriber: outbox.SubscriberConfig{Pool: pool, RejectHandler: deadLetters},
//		Topics:     []string{"orders"},
//		Target:     target,
//	}, logger)
//	defer fwd.Close()
//	err := fwd.Run(ctx)
//
// Watermill handler middleware (metrics, tracing, logging, correlation ids,
// Recoverer, Retry, PoisonQueue) sees the forwarder's traffic through
// Config.Middlewares, message by message and in seq order, while the
// batches are still sent whole; see Config.Middlewares.
//
// See docs/forwarder.md for the details.
package forwarder
