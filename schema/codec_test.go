package schema_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/schema"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

func read(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// orderV2 adds a field without a default: incompatible with order.avsc
// under BACKWARD (the new schema cannot read old records).
const orderV2 = `{"type": "record", "name": "Order", "namespace": "shop",
 "fields": [
  {"name": "id", "type": "string"},
  {"name": "customer", "type": "string"},
  {"name": "qty", "type": "int"},
  {"name": "note", "type": ["null", "string"], "default": null},
  {"name": "currency", "type": "string"}
 ]}`

// orderV2Compatible adds the field with a default.
const orderV2Compatible = `{"type": "record", "name": "Order", "namespace": "shop",
 "fields": [
  {"name": "id", "type": "string"},
  {"name": "customer", "type": "string"},
  {"name": "qty", "type": "int"},
  {"name": "note", "type": ["null", "string"], "default": null},
  {"name": "currency", "type": "string", "default": "EUR"}
 ]}`

func startCodec(t testing.TB, cl *sr.Client, edit func(*schema.Config), schemas ...schema.TopicSchema) (*schema.Codec, error) {
	t.Helper()
	cfg := schema.Config{Client: cl, Schemas: schemas}
	if edit != nil {
		edit(&cfg)
	}
	return schema.New(outboxtest.Ctx(t), cfg, nil)
}

// New registers each topic's schema under its subject, once: a second
// Codec (another replica, a restart) gets the same id and version.
func TestNewRegistersEachSchemaOnce(t *testing.T) {
	t.Parallel()
	r := schematest.New(t)
	cl := r.Client(t)
	orders, refunds, events := r.Name(t, "orders"), r.Name(t, "refunds"), r.Name(t, "events")
	schemas := []schema.TopicSchema{
		{Topic: orders, Format: schema.Avro, Text: read(t, "order.avsc")},
		{Topic: refunds, Format: schema.Protobuf, Text: read(t, "order.proto"), Message: "shop.Refund"},
		{Topic: events, Format: schema.JSONSchema, Text: read(t, "order.schema.json")},
	}
	first, err := startCodec(t, cl, nil, schemas...)
	if err != nil {
		t.Fatal(err)
	}
	second, err := startCodec(t, cl, nil, schemas...)
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{orders, refunds, events} {
		versions, err := cl.SubjectVersions(outboxtest.Ctx(t), topic+"-value")
		if err != nil || !slices.Equal(versions, []int{1}) {
			t.Errorf("subject %s-value: versions %v, %v; want [1]", topic, versions, err)
		}
		a, _ := first.NewMessage(topic, sample(t, first, topic))
		b, _ := second.NewMessage(topic, sample(t, second, topic))
		if a == nil || b == nil || a.Metadata.Get(schema.MetadataSchemaID) != b.Metadata.Get(schema.MetadataSchemaID) || a.Metadata.Get(schema.MetadataVersion) != "1" {
			t.Errorf("%s: the two Codecs disagree on the id: %v / %v", topic, a, b)
		}
	}
	if got := first.Topics(); !slices.Equal(got, []string{events, orders, refunds}) {
		t.Errorf("Topics: %v", got)
	}
}

// The subject strategies name subjects as Confluent's serializers do.
func TestSubjectStrategies(t *testing.T) {
	t.Parallel()
	r := schematest.New(t)
	cl := r.Client(t)
	ns := strings.ReplaceAll(r.Name(t, "s"), "-", "_")
	avsc := strings.Replace(read(t, "order.avsc"), `"namespace": "shop"`, `"namespace": "`+ns+`"`, 1)
	for _, tc := range []struct {
		strategy schema.SubjectStrategy
		topic    string
		want     string
	}{
		{schema.TopicName, r.Name(t, "a"), "%t-value"},
		{schema.RecordName, r.Name(t, "b"), ns + ".Order"},
		{schema.TopicRecordName, r.Name(t, "c"), "%t-" + ns + ".Order"},
	} {
		if _, err := startCodec(t, cl, func(c *schema.Config) { c.Subjects = tc.strategy }, schema.TopicSchema{Topic: tc.topic, Format: schema.Avro, Text: avsc}); err != nil {
			t.Fatal(err)
		}
		want := strings.ReplaceAll(tc.want, "%t", tc.topic)
		if _, err := cl.SubjectVersions(outboxtest.Ctx(t), want); err != nil {
			t.Errorf("%v: subject %s: %v", tc.strategy, want, err)
		}
	}
	// A record name is needed for the record strategies.
	_, err := startCodec(t, cl, func(c *schema.Config) { c.Subjects = schema.RecordName }, schema.TopicSchema{Topic: r.Name(t, "d"), Format: schema.JSONSchema, Text: `{"type": "object"}`})
	if !errors.Is(err, schema.ErrInvalidSchema) || !strings.Contains(err.Error(), "title") {
		t.Errorf("a JSON Schema without a title under RecordName: %v", err)
	}
}

// An incompatible new version stops New with the registry's reasons,
// naming the field; a compatible one is registered as version 2.
func TestNewRefusesAnIncompatibleSchemaNamingTheField(t *testing.T) {
	t.Parallel()
	r := schematest.New(t)
	cl := r.Client(t)
	topic := r.Name(t, "orders")
	if _, err := startCodec(t, cl, nil, schema.TopicSchema{Topic: topic, Format: schema.Avro, Text: read(t, "order.avsc")}); err != nil {
		t.Fatal(err)
	}
	_, err := startCodec(t, cl, nil, schema.TopicSchema{Topic: topic, Format: schema.Avro, Text: orderV2})
	var se *schema.SchemaError
	if !errors.As(err, &se) || !errors.Is(err, schema.ErrIncompatible) {
		t.Fatalf("an incompatible version: %v, want a *SchemaError matching ErrIncompatible", err)
	}
	if se.Topic != topic || se.Subject != topic+"-value" || len(se.Details) == 0 || !strings.Contains(strings.Join(se.Details, " "), "currency") {
		t.Errorf("the error does not name the topic, subject and field: %+v", se)
	}
	if versions, _ := cl.SubjectVersions(outboxtest.Ctx(t), topic+"-value"); !slices.Equal(versions, []int{1}) {
		t.Errorf("versions after the refusal: %v, want [1]", versions)
	}
	c, err := startCodec(t, cl, nil, schema.TopicSchema{Topic: topic, Format: schema.Avro, Text: orderV2Compatible})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.NewMessage(topic, map[string]any{"id": "o1", "customer": "c", "qty": 1, "note": nil, "currency": "USD"})
	if err != nil || m.Metadata.Get(schema.MetadataVersion) != "2" {
		t.Fatalf("a message of version 2: %v, %v", m, err)
	}
}

// RequireRegistered looks schemas up and never registers one.
func TestRequireRegisteredNeverRegisters(t *testing.T) {
	t.Parallel()
	r := schematest.New(t)
	cl := r.Client(t)
	topic := r.Name(t, "orders")
	ts := schema.TopicSchema{Topic: topic, Format: schema.Avro, Text: read(t, "order.avsc")}
	require := func(c *schema.Config) { c.Registration = schema.RequireRegistered }
	_, err := startCodec(t, cl, require, ts)
	if !errors.Is(err, schema.ErrNotRegistered) || !strings.Contains(err.Error(), topic+"-value") {
		t.Fatalf("an unknown subject: %v, want ErrNotRegistered naming the subject", err)
	}
	if subjects, _ := cl.Subjects(outboxtest.Ctx(t)); slices.Contains(subjects, topic+"-value") {
		t.Fatal("RequireRegistered registered the subject")
	}
	if _, err := cl.CreateSchema(outboxtest.Ctx(t), topic+"-value", sr.Schema{Schema: ts.Text, Type: sr.TypeAvro}); err != nil {
		t.Fatal(err)
	}
	if _, err := startCodec(t, cl, require, ts); err != nil {
		t.Fatalf("a registered schema: %v", err)
	}
	other := ts
	other.Text = orderV2Compatible
	if _, err := startCodec(t, cl, require, other); !errors.Is(err, schema.ErrNotRegistered) {
		t.Errorf("a schema other than the registered one: %v, want ErrNotRegistered", err)
	}
}

// A registry that is down at start stops New with a *RegistryError that
// says what to run; a schema that does not parse is refused before the
// registry is asked.
func TestNewWithTheRegistryDown(t *testing.T) {
	t.Parallel()
	reg := schematest.NewStandInRegistry(t)
	s, url := reg.StandIn, reg.URL
	if err := s.Down(); err != nil {
		t.Fatal(err)
	}
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	_, err = startCodec(t, cl, nil, schema.TopicSchema{Topic: "orders", Format: schema.Avro, Text: read(t, "order.avsc")})
	var re *schema.RegistryError
	if !errors.As(err, &re) || !errors.Is(err, schema.ErrRegistryUnavailable) || !strings.Contains(err.Error(), url) || !strings.Contains(err.Error(), "start the schema registry") {
		t.Fatalf("a registry that is down: %v", err)
	}
	if err := s.Up(); err != nil {
		t.Fatal(err)
	}
	before := s.Requests()
	_, err = startCodec(t, cl, nil, schema.TopicSchema{Topic: "orders", Format: schema.Avro, Text: `{"type": "record"}`})
	if !errors.Is(err, schema.ErrInvalidSchema) || !strings.Contains(err.Error(), `topic "orders"`) {
		t.Errorf("a schema that does not parse: %v", err)
	}
	if n := s.Requests() - before; n != 0 {
		t.Errorf("a schema that does not parse was sent to the registry (%d requests)", n)
	}
}

// Every impossible configuration is a *ConfigError naming the field.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	cl, err := sr.NewClient(sr.URLs("http://127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	avsc := read(t, "order.avsc")
	for field, cfg := range map[string]schema.Config{
		"Client":             {},
		"Subjects":           {Client: cl, Subjects: 9},
		"Registration":       {Client: cl, Registration: 9},
		"Timeout":            {Client: cl, Timeout: -1},
		"Schemas[0].Topic":   {Client: cl, Schemas: []schema.TopicSchema{{Format: schema.Avro, Text: avsc}}},
		"Schemas[1].Topic":   {Client: cl, Schemas: []schema.TopicSchema{{Topic: "a", Format: schema.Avro, Text: avsc}, {Topic: "a", Format: schema.Avro, Text: avsc}}},
		"Schemas[0].Format":  {Client: cl, Schemas: []schema.TopicSchema{{Topic: "a", Text: avsc}}},
		"Schemas[0].Text":    {Client: cl, Schemas: []schema.TopicSchema{{Topic: "a", Format: schema.Avro}}},
		"Schemas[0].Message": {Client: cl, Schemas: []schema.TopicSchema{{Topic: "a", Format: schema.Avro, Text: avsc, Message: "x"}}},
	} {
		err := cfg.Validate()
		if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "schema.Config."+field) {
			t.Errorf("%s: %v", field, err)
		}
		if _, err2 := schema.New(context.Background(), cfg, nil); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("%s: New says %v, Validate %v", field, err2, err)
		}
	}
}
