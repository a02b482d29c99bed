// Package schema gives outbox topics a schema: Avro, Protobuf or JSON
// Schema, kept in a schema registry (franz-go's sr client: Confluent
// Schema Registry, Karapace, Redpanda, Apicurio in ccompat mode).
//
// New registers (or requires registered) each topic's schema at start.
// The Codec's Publisher wraps the outbox Publisher and validates and
// encodes every message of those topics before it is written, in the
// caller's transaction: a message that does not match its schema is a
// *SchemaError, nothing of the Publish call is written, and the business
// change that published it does not commit. Payloads are stored, and
// forwarded, in the Confluent wire format (magic byte 0, the schema id,
// the record), which Kafka consumers read with their usual deserializers.
// Decode reads them back in a handler.
//
//	codec, err := schema.New(ctx, schema.Config{
//		Client:  registry, // sr.NewClient(sr.URLs("http://registry:8081"))
//		Schemas: []schema.TopicSchema{{Topic: "orders", Format: schema.Avro, Text: orderAvsc}},
//	}, logger)
//	pub, err := codec.Publisher(outboxPublisher)
//	msg, err := codec.NewMessage("orders", OrderPlaced{...})
//	err = pub.Publish("orders", msg) // msg bound to the transaction: outbox.WithTx
//
// An application that does not import this package links none of its
// dependencies. See docs/schemas.md.
package schema
