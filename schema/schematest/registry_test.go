package schematest_test

import (
	"encoding/binary"
	"regexp"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/millrace/watermill-outbox/schema/schematest"
)

// New uses the registry the environment names, without starting a
// stand-in (no network needed: nothing is asked of it).
func TestNewUsesTheEnvironmentsRegistry(t *testing.T) {
	t.Setenv(schematest.EnvRegistryURL, "http://registry.invalid:8081/")
	r := schematest.New(t)
	if r.URL != "http://registry.invalid:8081" || !r.External() || r.StandIn != nil {
		t.Fatalf("New with %s set: %+v, External %v", schematest.EnvRegistryURL, r, r.External())
	}
	if r.Client(t) == nil {
		t.Fatal("no client for the external registry")
	}
}

// Without the variable, New starts a stand-in for the test.
func TestNewStartsAStandIn(t *testing.T) {
	t.Setenv(schematest.EnvRegistryURL, "")
	r := schematest.New(t)
	if r.External() || r.StandIn == nil || r.URL == "" {
		t.Fatalf("New without %s: %+v", schematest.EnvRegistryURL, r)
	}
	if _, err := r.Client(t).Subjects(t.Context()); err != nil {
		t.Fatalf("the stand-in New started does not answer: %v", err)
	}
	if (*schematest.Registry)(nil).External() || (&schematest.Registry{}).External() {
		t.Error("a nil or zero Registry is not an external one")
	}
}

func TestName(t *testing.T) {
	t.Parallel()
	r := schematest.New(t)
	a, b := r.Name(t, "orders"), r.Name(t, "orders")
	if a == b || !regexp.MustCompile(`^orders-[0-9a-f]{12}$`).MatchString(a) {
		t.Fatalf("Name: %q and %q, want orders-<random hex>, different", a, b)
	}
}

// An event encoded by sr.Serde with an id the registry gave decodes with
// the schema the registry gives back for that id.
func TestSerdeRoundTrip(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	ctx := t.Context()
	s := subject(t, r, cl, "orders")
	id := register(t, cl, s, avroSchema(orderQtyDef))

	type order struct {
		ID   string `avro:"id"`
		Note string `avro:"note"`
		Qty  int    `avro:"qty"`
	}
	writer := avro.MustParse(orderQtyDef)
	var serde sr.Serde
	serde.Register(id, order{},
		sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(writer, v) }),
		sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(writer, b, v) }),
	)
	in := order{ID: "o-1", Note: "fragile", Qty: 3}
	b, err := serde.Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != 0 || binary.BigEndian.Uint32(b[1:5]) != uint32(id) {
		t.Fatalf("the wire format does not carry id %d: % x", id, b[:5])
	}

	// A consumer knows only the bytes: it asks the registry for the id.
	gotID, payload, err := serde.DecodeID(b)
	if err != nil || gotID != id {
		t.Fatalf("DecodeID: %d %v", gotID, err)
	}
	sch, err := cl.SchemaByID(ctx, gotID)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := avro.Parse(sch.Schema)
	if err != nil {
		t.Fatal(err)
	}
	var out order
	if err := avro.Unmarshal(reader, payload, &out); err != nil || out != in {
		t.Fatalf("decoded %+v (%v), want %+v", out, err, in)
	}
	var viaSerde order
	if err := serde.Decode(b, &viaSerde); err != nil || viaSerde != in {
		t.Fatalf("serde.Decode: %+v %v", viaSerde, err)
	}
}
