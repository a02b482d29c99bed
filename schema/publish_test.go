package schema_test

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/schema"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type order struct {
	ID       string  `avro:"id" json:"id"`
	Customer string  `avro:"customer" json:"customer"`
	Qty      int32   `avro:"qty" json:"qty"`
	Note     *string `avro:"note" json:"note,omitempty"`
}

// protoMessage compiles a .proto text and returns its message name, for
// values built with dynamicpb (there is no protoc here).
func protoMessage(t testing.TB, text, name string) protoreflect.MessageDescriptor {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"t.proto": text}),
	})}
	files, err := c.Compile(context.Background(), "t.proto")
	if err != nil {
		t.Fatal(err)
	}
	md, _ := files[0].FindDescriptorByName(protoreflect.FullName(name)).(protoreflect.MessageDescriptor)
	if md == nil {
		t.Fatalf("no message %s", name)
	}
	return md
}

// sample is a value of topic's schema in TestNewRegistersEachSchemaOnce.
func sample(t testing.TB, _ *schema.Codec, topic string) any {
	switch {
	case strings.HasPrefix(topic, "orders"):
		return order{ID: "o1", Customer: "c1", Qty: 2}
	case strings.HasPrefix(topic, "refunds"):
		m := dynamicpb.NewMessage(protoMessage(t, read(t, "order.proto"), "shop.Refund"))
		m.Set(m.Descriptor().Fields().ByName("order_id"), protoreflect.ValueOfString("o1"))
		return m
	}
	return map[string]any{"id": "o1", "qty": 2}
}

// env is an outbox schema with a business table, a registry and a Codec
// with an Avro schema for topic "orders…".
type env struct {
	b     *outboxtest.Bundle
	reg   *schematest.Registry
	codec *schema.Codec
	topic string
	pub   *schema.Publisher
}

func newEnv(t *testing.T, reg *schematest.Registry) *env {
	t.Helper()
	if reg == nil {
		reg = schematest.New(t)
	}
	e := &env{b: outboxtest.Setup(t), reg: reg, topic: reg.Name(t, "orders")}
	e.b.Register(e.topic, 2)
	e.b.Exec("CREATE TABLE " + e.b.Schema + ".orders (id text PRIMARY KEY)")
	var err error
	e.codec, err = schema.New(outboxtest.Ctx(t), schema.Config{Client: reg.Client(t), Schemas: []schema.TopicSchema{{Topic: e.topic, Format: schema.Avro, Text: read(t, "order.avsc")}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	outboxPub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.b.Schema, DB: e.b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e.pub, err = e.codec.Publisher(outboxPub); err != nil {
		t.Fatal(err)
	}
	return e
}

// placeOrder inserts the business row and publishes msgs in one
// transaction, committed only when Publish succeeds.
func (e *env) placeOrder(t *testing.T, id string, msgs ...*message.Message) error {
	t.Helper()
	ctx := outboxtest.Ctx(t)
	tx, err := e.b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "INSERT INTO "+e.b.Schema+".orders (id) VALUES ($1)", id); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		m.SetContext(outbox.WithTx(ctx, tx))
	}
	if err := e.pub.Publish(e.topic, msgs...); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// delivered reads n messages of the topic with a Subscriber.
func (e *env) delivered(t *testing.T, n int) []*message.Message {
	t.Helper()
	e.b.SequenceAll()
	sub := e.b.Subscriber("g", nil)
	ctx, cancel := context.WithCancel(outboxtest.Ctx(t))
	defer cancel()
	ch, err := sub.Subscribe(ctx, e.topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []*message.Message
	for len(out) < n {
		select {
		case m := <-ch:
			m.Ack()
			out = append(out, m)
		case <-ctx.Done():
			t.Fatalf("%d of %d messages delivered", len(out), n)
		}
	}
	return out
}

func avroBytes(t testing.TB, o order) []byte {
	t.Helper()
	b, err := avro.Marshal(avro.MustParse(read(t, "order.avsc")), o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A message that does not match its topic's schema makes the whole
// Publish fail with a *SchemaError: the caller's transaction does not
// commit, nothing of the call is written, and no message is changed.
func TestAMismatchRefusesTheWholeCallInsideTheTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	good := message.NewMessage("good", avroBytes(t, order{ID: "o1", Customer: "c", Qty: 1}))
	bad := message.NewMessage("bad", []byte(`{"id":"o1"}`)) // JSON, not an Avro record
	goodPayload := string(good.Payload)
	err := e.placeOrder(t, "o1", good, bad)
	var se *schema.SchemaError
	if !errors.As(err, &se) || !errors.Is(err, schema.ErrMismatch) {
		t.Fatalf("Publish of a bad event: %v, want a *SchemaError (ErrMismatch)", err)
	}
	if se.Topic != e.topic || se.Subject != e.topic+"-value" || se.Version != 1 || se.ID == 0 || se.UUID != "bad" {
		t.Errorf("the error does not say which topic, subject, version and message: %+v", se)
	}
	if n := e.b.Int("SELECT count(*) FROM " + e.b.Schema + ".orders"); n != 0 {
		t.Errorf("the business row committed with a malformed event: %d rows", n)
	}
	if n := e.b.Rows("pending"); n != 0 {
		t.Errorf("%d messages written", n)
	}
	if string(good.Payload) != goodPayload || good.Metadata.Get(schema.MetadataSchemaID) != "" {
		t.Error("the refused call changed a message")
	}
}

// Bare records and NewMessage's, a tombstone and a dedup key all publish;
// the Subscriber delivers the wire format with the schema's metadata, and
// Decode (as sr.Serde does) reads each.
func TestPublishedRecordsAreInTheWireFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	bare := message.NewMessage("bare", avroBytes(t, order{ID: "o1", Customer: "c1", Qty: 1}))
	bare.Metadata.Set(outbox.PublishPartitionKeyMetadata, "c1")
	made, err := e.codec.NewMessage(e.topic, order{ID: "o2", Customer: "c1", Qty: 2})
	if err != nil {
		t.Fatal(err)
	}
	made.Metadata.Set(outbox.PublishPartitionKeyMetadata, "c1")
	if err := outbox.DedupKey(made, "order-o2"); err != nil {
		t.Fatal(err)
	}
	tomb := message.NewMessage("tomb", nil)
	tomb.Metadata.Set(outbox.PublishPartitionKeyMetadata, "c1")
	if err := outbox.Tombstone(tomb); err != nil {
		t.Fatal(err)
	}
	if err := e.placeOrder(t, "o1", bare, made, tomb); err != nil {
		t.Fatal(err)
	}
	dup, err := e.codec.NewMessage(e.topic, order{ID: "o2", Customer: "c1", Qty: 2})
	if err != nil {
		t.Fatal(err)
	}
	_ = outbox.DedupKey(dup, "order-o2")
	if err := e.placeOrder(t, "o2", dup); err != nil {
		t.Fatal(err)
	}
	if !outbox.Deduplicated(dup) {
		t.Error("the duplicate was not left out")
	}
	got := e.delivered(t, 3)
	id := bare.Metadata.Get(schema.MetadataSchemaID)
	serde := sr.NewSerde()
	idNum, err := strconv.Atoi(id)
	if err != nil {
		t.Fatalf("metadata %s: %q", schema.MetadataSchemaID, id)
	}
	s := avro.MustParse(read(t, "order.avsc"))
	serde.Register(idNum, order{}, sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(s, b, v) }))
	for i, want := range []string{"o1", "o2", ""} {
		m := got[i]
		if want == "" {
			if !outbox.IsTombstone(m) || len(m.Payload) != 0 {
				t.Errorf("delivery %d: want the tombstone, got %q", i, m.Payload)
			}
			continue
		}
		if m.Metadata.Get(schema.MetadataSchemaID) != id || m.Metadata.Get(schema.MetadataSubject) != e.topic+"-value" || m.Metadata.Get(schema.MetadataVersion) != "1" {
			t.Errorf("delivery %d: metadata %v", i, m.Metadata)
		}
		var viaSerde, viaCodec order
		if err := serde.Decode(m.Payload, &viaSerde); err != nil || viaSerde.ID != want {
			t.Errorf("delivery %d read by sr.Serde: %+v, %v", i, viaSerde, err)
		}
		if err := e.codec.Decode(m, &viaCodec); err != nil || viaCodec != viaSerde {
			t.Errorf("delivery %d read by Codec.Decode: %+v, %v", i, viaCodec, err)
		}
	}
	// Publishing a delivered (wire format) message again validates it as it is.
	again := message.NewMessage("again", got[0].Payload)
	again.Metadata = maps.Clone(got[0].Metadata)
	if err := e.placeOrder(t, "o3", again); err != nil {
		t.Fatalf("republishing a record in the wire format: %v", err)
	}
	tampered := message.NewMessage("tampered", append(append([]byte{}, got[0].Payload[:5]...), 0xff, 0xff))
	tampered.Metadata.Set(schema.MetadataSchemaID, id)
	if err := e.placeOrder(t, "o4", tampered); !errors.Is(err, schema.ErrMismatch) {
		t.Errorf("a wire-format payload whose record is garbage: %v", err)
	}
	liar := message.NewMessage("liar", avroBytes(t, order{ID: "o5", Customer: "c", Qty: 1}))
	liar.Metadata.Set(schema.MetadataSchemaID, id)
	if err := e.placeOrder(t, "o5", liar); !errors.Is(err, schema.ErrMismatch) || !strings.Contains(err.Error(), "wire format") {
		t.Errorf("a bare record claiming the wire format: %v", err)
	}
}

// A Go value of the wrong type, or for a topic without a schema, is a
// *SchemaError; Decode into the wrong type is one too.
func TestWrongGoValues(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	if _, err := e.codec.NewMessage(e.topic, struct{ Name int }{1}); !errors.Is(err, schema.ErrMismatch) || !strings.Contains(err.Error(), e.topic) {
		t.Errorf("a struct of other fields: %v", err)
	}
	if _, err := e.codec.NewMessage("nope", order{}); !errors.Is(err, schema.ErrNotRegistered) {
		t.Errorf("a topic without a schema: %v", err)
	}
	m, err := e.codec.NewMessage(e.topic, order{ID: "o1", Qty: 1})
	if err != nil {
		t.Fatal(err)
	}
	var wrong struct{ Qty string }
	if err := e.codec.Decode(m, &wrong); !errors.Is(err, schema.ErrMismatch) {
		t.Errorf("Decode into a struct whose qty is a string: %v", err)
	}
	if err := e.codec.Decode(message.NewMessage("x", []byte("plain")), &order{}); !errors.Is(err, schema.ErrMismatch) || !strings.Contains(err.Error(), "wire format") {
		t.Errorf("Decode of a payload not in the wire format: %v", err)
	}
	unknown := message.NewMessage("x", []byte{0, 0x7f, 0xff, 0xff, 0xf0, 2})
	if err := e.codec.Decode(unknown, &order{}); !errors.Is(err, schema.ErrNotRegistered) {
		t.Errorf("Decode of a schema id the registry does not know: %v", err)
	}
}

// Topics without a schema pass as they are.
func TestTopicsWithoutASchemaPass(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.b.Register("plain", 1)
	pub, err := e.codec.Publisher(e.b.Publisher(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("plain", message.NewMessage("p", []byte("anything"))); err != nil {
		t.Fatal(err)
	}
	if n := e.b.Int("SELECT count(*) FROM " + e.b.Schema + ".pending WHERE topic = 'plain'"); n != 1 {
		t.Errorf("%d messages of the plain topic", n)
	}
}

// No registry round trip per message: publishing asks the registry
// nothing. With the registry down, cached ids keep publishing, and a
// record of an id never seen fails typed with nothing written; once the
// registry is back, it is looked up once.
func TestTheRegistryDownLater(t *testing.T) {
	t.Parallel()
	reg := schematest.NewStandInRegistry(t)
	s := reg.StandIn
	e := newEnv(t, reg)
	// A second version registered by another service: its id is unseen here.
	other, err := reg.Client(t).CreateSchema(outboxtest.Ctx(t), e.topic+"-value", sr.Schema{Schema: orderV2Compatible, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	before := s.Requests()
	for i := range 100 {
		if err := e.placeOrder(t, "a"+strconv.Itoa(i), message.NewMessage("m", avroBytes(t, order{ID: "x", Qty: 1}))); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Requests() - before; n != 0 {
		t.Fatalf("100 publishes asked the registry %d times", n)
	}
	if err := s.Down(); err != nil {
		t.Fatal(err)
	}
	if err := e.placeOrder(t, "down1", message.NewMessage("m", avroBytes(t, order{ID: "y", Qty: 1}))); err != nil {
		t.Fatalf("publishing with a cached id while the registry is down: %v", err)
	}
	v2 := avro.MustParse(orderV2Compatible)
	body, err := avro.Marshal(v2, map[string]any{"id": "z", "customer": "c", "qty": 1, "note": nil, "currency": "USD"})
	if err != nil {
		t.Fatal(err)
	}
	unseen := func() *message.Message {
		wire, err := (&sr.ConfluentHeader{}).AppendEncode(nil, other.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		m := message.NewMessage("v2", append(wire, body...))
		m.Metadata.Set(schema.MetadataSchemaID, strconv.Itoa(other.ID))
		return m
	}
	pendingBefore := e.b.Rows("pending")
	err = e.placeOrder(t, "down2", unseen())
	if !errors.Is(err, schema.ErrRegistryUnavailable) {
		t.Fatalf("a record of an unseen id with the registry down: %v, want ErrRegistryUnavailable", err)
	}
	if e.b.Rows("pending") != pendingBefore || e.b.Int("SELECT count(*) FROM "+e.b.Schema+".orders WHERE id = 'down2'") != 0 {
		t.Error("something of the refused call was written")
	}
	if err := s.Up(); err != nil {
		t.Fatal(err)
	}
	before = s.Requests()
	for _, id := range []string{"up1", "up2"} {
		m := unseen()
		if err := e.placeOrder(t, id, m); err != nil {
			t.Fatalf("a record of version 2 once the registry is back: %v", err)
		}
		if m.Metadata.Get(schema.MetadataVersion) != "2" {
			t.Errorf("version metadata %q, want 2", m.Metadata.Get(schema.MetadataVersion))
		}
	}
	if n := s.Requests() - before; n == 0 || n > 2 {
		t.Errorf("two records of an unseen id asked the registry %d times; want it once per id (schema and its versions)", n)
	}
}

// A consumer whose Go type is of an older version reads a newer record
// (a field added with a default): the new field is skipped, as Avro's
// schema resolution does; a type of another record is refused.
func TestDecodeReadsANewerVersionIntoAnOlderType(t *testing.T) {
	t.Parallel()
	reg := schematest.New(t)
	topic := reg.Name(t, "orders")
	cl := reg.Client(t)
	if _, err := startCodec(t, cl, nil, schema.TopicSchema{Topic: topic, Format: schema.Avro, Text: read(t, "order.avsc")}); err != nil {
		t.Fatal(err)
	}
	v2, err := startCodec(t, cl, nil, schema.TopicSchema{Topic: topic, Format: schema.Avro, Text: orderV2Compatible})
	if err != nil {
		t.Fatal(err)
	}
	m, err := v2.NewMessage(topic, map[string]any{"id": "o9", "customer": "c", "qty": 3, "note": nil, "currency": "USD"})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := startCodec(t, cl, nil) // no Schemas: it only reads
	if err != nil {
		t.Fatal(err)
	}
	var old order
	if err := reader.Decode(m, &old); err != nil || old.ID != "o9" || old.Qty != 3 {
		t.Fatalf("a version-2 record into the version-1 type: %+v, %v", old, err)
	}
	var other struct {
		Name string `avro:"name"`
	}
	if err := reader.Decode(m, &other); !errors.Is(err, schema.ErrMismatch) || !strings.Contains(err.Error(), "none of the fields") {
		t.Errorf("a type of another record: %v", err)
	}
}
