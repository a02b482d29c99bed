// Package outbox is a transactional outbox for Watermill on PostgreSQL.
//
// A Publisher writes messages inside the caller's own transaction, so a
// message is stored if and only if the business change it describes
// commits. A Sequencer then gives every committed message a gap-free seq
// within its partition (partition = hash of the message's partition key),
// after commit, so that readers that follow seq never skip a message whose
// transaction committed late. Subscribers read each partition in order.
//
// Set up the tables once per database, and register each topic with its
// partition count (both idempotent, safe from many instances at once):
//
//	err := outbox.Migrate(ctx, pool, outbox.DefaultSchema)
//	err = outbox.RegisterTopic(ctx, pool, outbox.DefaultSchema, "orders", 16)
//
// Publish in a handler's transaction:
//
//	pub, _ := outbox.NewPublisher(outbox.PublisherConfig{}, logger)
//	tx, _ := pool.Begin(ctx)
//	// ... the handler's own writes on tx ...
//	msg := message.NewMessage(watermill.NewUUID(), payload)
//	msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, orderID)
//	msg.SetContext(outbox.WithTx(ctx, tx))
//	err = pub.Publish("orders", msg)
//	err = tx.Commit(ctx)
package outbox
