package kafka_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/cetest"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/relay"
	"github.com/millrace/watermill-outbox/schema"
)

// The schemas of the end-to-end tests: an Avro record and the same order
// as a Protobuf message.
const (
	orderAvsc  = `{"type":"record","name":"OrderPlaced","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"amount","type":"long"}]}`
	orderProto = `syntax = "proto3";
package shop;
message OrderPlaced {
  string id = 1;
  int64 amount = 2;
}
`
)

// orderPlaced is a record of orderAvsc.
type orderPlaced struct {
	ID     string `avro:"id"`
	Amount int64  `avro:"amount"`
}

// orderDescriptor compiles orderProto as an application without generated
// code would (no protoc here): the message a dynamicpb value is built of.
func orderDescriptor(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	c := protocompile.Compiler{Resolver: &protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"order.proto": orderProto}),
	}}
	files, err := c.Compile(context.Background(), "order.proto")
	if err != nil {
		t.Fatal(err)
	}
	return files[0].Messages().ByName("OrderPlaced")
}

func protoOrder(desc protoreflect.MessageDescriptor, id string, amount int64) *dynamicpb.Message {
	m := dynamicpb.NewMessage(desc)
	m.Set(desc.Fields().ByName("id"), protoreflect.ValueOfString(id))
	m.Set(desc.Fields().ByName("amount"), protoreflect.ValueOfInt64(amount))
	return m
}

// schemaRun is one end-to-end run: an outbox with an Avro and a Protobuf
// topic, each forwarded to a Kafka topic of its own.
type schemaRun struct {
	e          fwdtest.Env
	c          *kafkatest.Cluster
	mode       outbox.PublishMode
	ce         bool   // the target sends binary CloudEvents, the Codec sets their metadata
	avroTopic  string // outbox topics
	protoTopic string
}

// published is what the test published of one message.
type published struct {
	key   string
	avro  *orderPlaced       // an Avro record
	proto *dynamicpb.Message // a Protobuf record
	tomb  bool
}

// run publishes through codec.Publisher(outbox Publisher) in the caller's
// transactions, forwards exactly once to Kafka, consumes the records with
// kgo and decodes each value with franz-go's sr.Serde: equal to what was
// published, a tombstone a null value, a deduplicated message never sent.
func (r schemaRun) run(t *testing.T) {
	ctx := outboxtest.Ctx(t)
	reg := newRegistry(t)
	// Subjects are "<topic>-value": topics of their own, for a shared
	// registry.
	r.avroTopic, r.protoTopic = reg.name(t, r.avroTopic), reg.name(t, r.protoTopic)
	for _, topic := range []string{r.avroTopic, r.protoTopic} {
		if err := outbox.RegisterTopic(ctx, r.e.Pool, r.e.Schema, topic, 2); err != nil {
			t.Fatal(err)
		}
	}
	codec, err := schema.New(ctx, schema.Config{Client: reg.client, CloudEventsMetadata: r.ce, Schemas: []schema.TopicSchema{
		{Topic: r.avroTopic, Format: schema.Avro, Text: orderAvsc},
		{Topic: r.protoTopic, Format: schema.Protobuf, Text: orderProto},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	avroSchema := avro.MustParse(orderAvsc)
	desc := orderDescriptor(t)

	// Transaction 1: a business row and the events, one from
	// Codec.NewMessage, the others as the bare record the Publisher
	// validates and frames; a tombstone of key order-2; order-3 with a
	// dedup key.
	want := map[string]published{}
	keyed := func(key string, payload []byte) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), payload)
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
		return m
	}
	avroMsg := func(key string, v orderPlaced) *message.Message {
		b, err := avro.Marshal(avroSchema, v)
		if err != nil {
			t.Fatal(err)
		}
		m := keyed(key, b)
		want[m.UUID] = published{key: key, avro: &v}
		return m
	}
	first := orderPlaced{ID: "order-1", Amount: 100}
	m0, err := codec.NewMessage(r.avroTopic, first)
	if err != nil {
		t.Fatal(err)
	}
	m0.Metadata.Set(outbox.PublishPartitionKeyMetadata, "order-1")
	want[m0.UUID] = published{key: "order-1", avro: &first}
	m1 := avroMsg("order-2", orderPlaced{ID: "order-2", Amount: 250})
	m2 := avroMsg("order-3", orderPlaced{ID: "order-3", Amount: 7})
	if err := outbox.DedupKey(m2, "order-3-placed"); err != nil {
		t.Fatal(err)
	}
	tomb := keyed("order-2", nil)
	if err := outbox.Tombstone(tomb); err != nil {
		t.Fatal(err)
	}
	want[tomb.UUID] = published{key: "order-2", tomb: true}

	p0v := protoOrder(desc, "order-1", 100)
	p0, err := codec.NewMessage(r.protoTopic, p0v)
	if err != nil {
		t.Fatal(err)
	}
	p0.Metadata.Set(outbox.PublishPartitionKeyMetadata, "order-1")
	want[p0.UUID] = published{key: "order-1", proto: p0v}
	p1v := protoOrder(desc, "order-2", 250)
	b, err := proto.Marshal(p1v)
	if err != nil {
		t.Fatal(err)
	}
	p1 := keyed("order-2", b)
	want[p1.UUID] = published{key: "order-2", proto: p1v}

	r.inTransaction(t, codec, "order-1", map[string][]*message.Message{r.avroTopic: {m0, m1, m2, tomb}, r.protoTopic: {p0, p1}})
	// Transaction 2: order-3 again under its dedup key (left out), and
	// order-4.
	dup := avroMsg("order-3", orderPlaced{ID: "order-3", Amount: 8})
	delete(want, dup.UUID)
	if err := outbox.DedupKey(dup, "order-3-placed"); err != nil {
		t.Fatal(err)
	}
	m4 := avroMsg("order-4", orderPlaced{ID: "order-4", Amount: 1})
	r.inTransaction(t, codec, "order-4", map[string][]*message.Message{r.avroTopic: {dup, m4}})
	if !outbox.Deduplicated(dup) || outbox.Deduplicated(m4) {
		t.Fatalf("Deduplicated: the repeat %v, order-4 %v; want true, false", outbox.Deduplicated(dup), outbox.Deduplicated(m4))
	}

	// Forward exactly once, each outbox topic to a Kafka topic of its own.
	kafkaTopics := map[string]string{r.avroTopic: r.c.Topic(t, "orders-avro", 2, nil), r.protoTopic: r.c.Topic(t, "orders-proto", 2, nil)}
	cfg := kafka.Config{Brokers: r.c.Brokers}
	if r.ce {
		cfg.CloudEvents = forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/shop/orders",
			Type: func(*message.Message) string { return "com.example.order.placed" }}
	}
	fwd := fwdtest.StartForwarder(t, r.e, nil, newTargetWith(t, cfg), []string{r.avroTopic, r.protoTopic}, func(c *forwarder.Config) {
		c.TargetTopic = func(topic string) string { return kafkaTopics[topic] }
	})
	outboxtest.WaitFor(t, "every message forwarded", 2*time.Minute, func() bool {
		s := fwd.Stats()
		return s.Messages+s.Rejected >= int64(len(want))
	})
	if dead := r.e.DeadLettered(t); len(dead) != 0 {
		t.Fatalf("dead letters: %v", dead)
	}

	// An ordinary Kafka consumer: kgo, read_committed, sr.Serde with the
	// ids the registry gave.
	avroID := reg.id(t, r.avroTopic+"-value", sr.Schema{Schema: orderAvsc, Type: sr.TypeAvro})
	protoID := reg.id(t, r.protoTopic+"-value", sr.Schema{Schema: orderProto, Type: sr.TypeProtobuf})
	var serde sr.Serde
	serde.Register(avroID, orderPlaced{}, sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(avroSchema, b, v) }))
	serde.Register(protoID, &dynamicpb.Message{}, sr.Index(0), sr.DecodeFn(func(b []byte, v any) error { return proto.Unmarshal(b, v.(*dynamicpb.Message)) }))
	ids := map[string]int{r.avroTopic: avroID, r.protoTopic: protoID}
	contentTypes := map[string]string{r.avroTopic: "application/avro", r.protoTopic: "application/x-protobuf"}

	seen := map[string]bool{}
	for _, topic := range []string{r.avroTopic, r.protoTopic} {
		n := 0
		for _, p := range want {
			if (p.proto != nil) == (topic == r.protoTopic) {
				n++
			}
		}
		records := consumeAll(t, r.c, kafkaTopics[topic], n)
		if committed := r.c.ReadCommitted(t, kafkaTopics[topic]); len(committed) != n {
			t.Fatalf("%s: Kafka holds %d committed records, want %d (each message once)", topic, len(committed), n)
		}
		lastOf := map[string]string{} // key -> uuid of its last record, to check the tombstone comes last
		for _, rec := range records {
			uuid := kafkatest.Header(rec, kafka.UUIDHeaderKey)
			p, ok := want[uuid]
			if !ok || seen[uuid] {
				t.Fatalf("%s: record of message %s (seen before: %v), not one published once", topic, uuid, seen[uuid])
			}
			seen[uuid] = true
			lastOf[string(rec.Key)] = uuid
			if string(rec.Key) != p.key {
				t.Fatalf("%s: record %s has key %q, want %q", topic, uuid, rec.Key, p.key)
			}
			r.checkRecord(t, reg, rec, p, &serde, ids[topic], contentTypes[topic])
		}
		if topic == r.avroTopic && lastOf["order-2"] != tomb.UUID {
			t.Fatalf("the last record of key order-2 is %s, want the tombstone %s", lastOf["order-2"], tomb.UUID)
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("%d messages arrived, want %d", len(seen), len(want))
	}
}

// inTransaction publishes msgs by topic through the Codec's Publisher
// around an outbox Publisher in the caller's transaction, with a business
// row of its own, and commits.
func (r schemaRun) inTransaction(t *testing.T, codec *schema.Codec, row string, msgs map[string][]*message.Message) {
	t.Helper()
	ctx := outboxtest.Ctx(t)
	tx, err := r.e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
	if _, err := tx.Exec(ctx, `INSERT INTO `+r.e.Schema+`.orders_business (id) VALUES ($1)`, r.avroTopic+"/"+row); err != nil {
		t.Fatal(err)
	}
	next, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: r.e.Schema, Mode: r.mode}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := codec.Publisher(next)
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{r.avroTopic, r.protoTopic} {
		if len(msgs[topic]) == 0 {
			continue
		}
		if err := pub.Publish(topic, msgs[topic]...); err != nil {
			t.Fatalf("Publish to %s: %v", topic, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkRecord checks one record against what was published: the value
// decoded by serde, the schema headers, in CloudEvents the dataschema (the
// registry URL of the id) and content type, read by the CloudEvents SDK.
func (r schemaRun) checkRecord(t *testing.T, reg registry, rec *kgo.Record, p published, serde *sr.Serde, id int, contentType string) {
	t.Helper()
	uuid := kafkatest.Header(rec, kafka.UUIDHeaderKey)
	if p.tomb {
		if rec.Value != nil {
			t.Fatalf("tombstone %s: value %q, want null", uuid, rec.Value)
		}
		if kafkatest.Header(rec, schema.MetadataSchemaID) != "" {
			t.Fatalf("tombstone %s has a schema id", uuid)
		}
		return
	}
	if got := kafkatest.Header(rec, schema.MetadataSchemaID); got != strconv.Itoa(id) {
		t.Fatalf("record %s: header %s %q, want %d", uuid, schema.MetadataSchemaID, got, id)
	}
	switch {
	case p.avro != nil:
		var got orderPlaced
		if err := serde.Decode(rec.Value, &got); err != nil || got != *p.avro {
			t.Fatalf("record %s: decoded %+v, %v; want %+v", uuid, got, err, *p.avro)
		}
	default:
		got := dynamicpb.NewMessage(p.proto.Descriptor())
		if err := serde.Decode(rec.Value, got); err != nil || !proto.Equal(got, p.proto) {
			t.Fatalf("record %s: decoded %v, %v; want %v", uuid, got, err, p.proto)
		}
	}
	dataschema := fmt.Sprintf("%s/schemas/ids/%d", reg.url, id)
	if !r.ce {
		if h := kafkatest.Header(rec, "ce_dataschema"); h != "" {
			t.Fatalf("record %s: header ce_dataschema %q without CloudEvents", uuid, h)
		}
		return
	}
	if h, ct := kafkatest.Header(rec, "ce_dataschema"), kafkatest.Header(rec, "content-type"); h != dataschema || ct != contentType {
		t.Fatalf("record %s: ce_dataschema %q, content-type %q; want %q, %q", uuid, h, ct, dataschema, contentType)
	}
	ev := cetest.Event(t, cetest.FromKafka(rec))
	if ev.DataSchema() != dataschema || ev.DataContentType() != contentType || string(ev.Data()) != string(rec.Value) {
		t.Fatalf("record %s: the SDK reads %s", uuid, ev)
	}
}

// consumeAll reads topic from its start as an application's consumer does
// (a consumer group, read_committed) until it has n records.
func consumeAll(t *testing.T, c *kafkatest.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.ConsumerGroup("schema-test-"+topic), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.DisableAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(outboxtest.Ctx(t), time.Minute)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consuming %s: %d records of %d: %v", topic, len(out), n, ctx.Err())
		}
		fetches.EachError(func(_ string, p int32, err error) { t.Fatalf("consuming %s/%d: %v", topic, p, err) })
		out = append(out, fetches.Records()...)
	}
	return out
}

// prepare makes the business table of e.
func prepare(t *testing.T, pool *pgxpool.Pool, schemaName string) {
	t.Helper()
	if _, err := pool.Exec(outboxtest.Ctx(t), `CREATE TABLE `+schemaName+`.orders_business (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
}

// Events of topics with a schema, published in the caller's transaction
// through schema.Codec's Publisher around the outbox Publisher (the table
// mode), reach Kafka exactly once as the Confluent wire format, which an
// ordinary consumer decodes with franz-go's sr.Serde (Avro with hamba/avro,
// Protobuf into a dynamicpb message): a tombstone as a null value, a
// duplicate by dedup key not at all; with binary CloudEvents each record's
// ce_dataschema is the registry URL of its schema id.
func TestSchemaRecordsReachKafkaDecodable(t *testing.T) {
	for _, ce := range []bool{false, true} {
		name := "plain"
		if ce {
			name = "cloudevents"
		}
		t.Run(name, func(t *testing.T) {
			e := fwdtest.NewEnv(t)
			prepare(t, e.Pool, e.Schema)
			schemaRun{e: e, c: kafkatest.New(t), mode: outbox.ModeTable, ce: ce, avroTopic: "orders_avro", protoTopic: "orders_proto"}.run(t)
		})
	}
}

// The same in the log-based mode: Publishers in ModeWAL write the events
// into the WAL in the caller's transaction, the relay appends them to the
// log, and the forwarder sends them on.
func TestSchemaRecordsReachKafkaDecodableInTheLogBasedMode(t *testing.T) {
	b, _ := outboxtest.OwnCluster(t, map[string]string{"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4", "wal_writer_delay": "10ms"}, "schemawal")
	e := fwdtest.EnvOf(b)
	prepare(t, e.Pool, e.Schema)
	ctx := outboxtest.Ctx(t)
	if err := relay.CreateSlot(ctx, e.Pool, e.Schema); err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(relay.Config{Schema: e.Schema, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rl.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = rl.Close()
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
		_ = relay.DropSlot(context.Background(), e.Pool, e.Schema, true)
	})
	for _, ce := range []bool{false, true} {
		name := "plain"
		if ce {
			name = "cloudevents"
		}
		t.Run(name, func(t *testing.T) {
			schemaRun{e: e, c: kafkatest.New(t), mode: outbox.ModeWAL, ce: ce, avroTopic: name + "_avro", protoTopic: name + "_proto"}.run(t)
		})
	}
	// Each run stores 7 messages (the dedup repeat is left out at publish).
	if n := rl.Stats().Appended; !t.Failed() && n != 14 {
		t.Fatalf("the relay appended %d messages, want 14: the events did not all go through the WAL", n)
	}
}
