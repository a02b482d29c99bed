package schema_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/schema"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

// The cost of a schema per message, without a database: a ~1 KB order
// (benchOrder) encoded from a Go value into a message in the wire format
// (Codec.NewMessage), and given as record bytes to the Publisher, which
// validates them and prepends the header (the wrapped Publisher discards
// the messages). Run with
//
//	go test ./schema -run '^$' -bench 'NewMessage|PublisherBytes' -benchmem
//
// BenchmarkPublish100PerTx (publish_bench_test.go) measures what it costs
// against PostgreSQL.

// BenchmarkNewMessage encodes a Go value with the topic's schema into a
// message in the wire format: an Avro struct (hamba/avro), a dynamicpb
// Protobuf message.
func BenchmarkNewMessage(b *testing.B) {
	order := benchOrder(1)
	b.Run("avro", func(b *testing.B) {
		codec, topic := newCodec(b, schema.Avro, orderAvro)
		checkSize(b, "Avro", avroRecord(b, order))
		benchNewMessage(b, codec, topic, order)
	})
	b.Run("protobuf", func(b *testing.B) {
		codec, topic := newCodec(b, schema.Protobuf, orderProto)
		md := orderDescriptor(b)
		checkSize(b, "Protobuf", protoRecord(b, md, order))
		benchNewMessage(b, codec, topic, protoOrder(md, order))
	})
}

func benchNewMessage(b *testing.B, codec *schema.Codec, topic string, v any) {
	m, err := codec.NewMessage(topic, v)
	if err != nil {
		b.Fatal(err)
	}
	if !isWire(m.Payload, m.Metadata.Get(schema.MetadataSchemaID)) {
		b.Fatalf("NewMessage's payload is not in the wire format: % x", m.Payload[:8])
	}
	b.SetBytes(int64(len(m.Payload)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := codec.NewMessage(topic, v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPublisherBytes publishes the record's bytes through the
// Codec's Publisher: it validates them against the topic's schema and
// replaces the payload with its wire format (and sets the schema's
// metadata) before the wrapped Publisher, which discards them.
func BenchmarkPublisherBytes(b *testing.B) {
	order := benchOrder(1)
	b.Run("avro", func(b *testing.B) {
		codec, topic := newCodec(b, schema.Avro, orderAvro)
		record := avroRecord(b, order)
		checkSize(b, "Avro", record)
		benchPublisherBytes(b, codec, topic, record)
	})
	b.Run("protobuf", func(b *testing.B) {
		codec, topic := newCodec(b, schema.Protobuf, orderProto)
		record := protoRecord(b, orderDescriptor(b), order)
		checkSize(b, "Protobuf", record)
		benchPublisherBytes(b, codec, topic, record)
	})
}

func benchPublisherBytes(b *testing.B, codec *schema.Codec, topic string, record []byte) {
	var sink discard
	pub, err := codec.Publisher(&sink)
	if err != nil {
		b.Fatal(err)
	}
	m := message.NewMessage("bench-1", record)
	// reset makes m the bare record again: the Publisher replaced its
	// payload and set the schema's metadata, which would send the next
	// Publish down the path of a payload in the wire format.
	reset := func() {
		m.Payload = record
		delete(m.Metadata, schema.MetadataSchemaID)
		delete(m.Metadata, schema.MetadataSubject)
		delete(m.Metadata, schema.MetadataVersion)
	}
	if err := pub.Publish(topic, m); err != nil {
		b.Fatal(err)
	}
	if sink.n != 1 || !isWire(sink.last, m.Metadata.Get(schema.MetadataSchemaID)) || len(sink.last) <= len(record) {
		b.Fatalf("the Publisher passed on %d messages, the last not in the wire format: % x", sink.n, sink.last[:8])
	}
	// A record that does not match is refused, or this measures nothing.
	if err := pub.Publish(topic, message.NewMessage("bench-bad", record[:len(record)/2])); err == nil {
		b.Fatal("the Publisher let a truncated record through")
	}
	b.SetBytes(int64(len(record)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		reset()
		if err := pub.Publish(topic, m); err != nil {
			b.Fatal(err)
		}
	}
}

// newCodec starts a Codec with a schema for one topic, on the registry
// of schematest.New (a stand-in of its own, or the real registry of
// OUTBOX_TEST_SCHEMA_REGISTRY_URL), and returns it and the topic (named
// apart, so that its subject is new on a shared registry too).
func newCodec(tb testing.TB, format schema.Format, text string) (*schema.Codec, string) {
	tb.Helper()
	reg := schematest.New(tb)
	topic := reg.Name(tb, "orders")
	codec, err := schema.New(context.Background(), schema.Config{
		Client:  reg.Client(tb),
		Schemas: []schema.TopicSchema{{Topic: topic, Format: format, Text: text}},
	}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return codec, topic
}

// discard is a message.Publisher that keeps the last payload it was given.
type discard struct {
	n    int
	last []byte
}

func (d *discard) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		d.n++
		d.last = m.Payload
	}
	return nil
}

func (d *discard) Close() error { return nil }
