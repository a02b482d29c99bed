// Package schema validates and encodes the events of an outbox against a
// schema registry (Confluent Schema Registry and its compatible peers:
// Apicurio in ccompat mode, Karapace, Redpanda), in Avro, Protobuf or JSON
// Schema, inside the publishing transaction: an event that does not match
// its topic's schema is refused at Publish, typed (*SchemaError), so the
// business change cannot commit with an event its consumers cannot read.
// (A Kafka Connect converter finds the same event after it committed.)
//
// The events are stored in the registry's wire format (magic byte 0, the
// 4-byte schema id, for Protobuf the message indexes, then the record), so
// the forwarder sends bytes Kafka consumers read as they are, with their
// usual deserializers (franz-go's sr.Serde, Confluent's).
//
//	cl, _ := sr.NewClient(sr.URLs("http://registry:8081"))
//	codec, err := schema.New(ctx, schema.Config{
//		Client:  cl,
//		Schemas: []schema.TopicSchema{{Topic: "orders", Format: schema.Avro, Text: orderAvsc}},
//	}, logger) // registers the schema, or says why the registry refused it
//	pub, _ := codec.Publisher(outboxPublisher)
//	msg, err := codec.NewMessage("orders", Order{ID: "o1", Qty: 2}) // a Go value
//	msg.SetContext(outbox.WithTx(ctx, tx))
//	err = pub.Publish("orders", msg) // validated, in tx
//
// A message whose payload is the record itself (Avro binary, protobuf
// binary, JSON text) is validated as it is and put into the wire format.
// Consumers decode with Codec.Decode or Handler; the CLI and the console
// render schema'd payloads as JSON with Codec.JSON. docs/schemas.md has
// the whole story; package schematest has an in-process registry for
// tests.
//
// Only this package links the registry client, Avro, .proto parsing and
// JSON Schema libraries: an application that does not import it links
// none of them.
package schema
