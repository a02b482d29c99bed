package schema_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"google.golang.org/protobuf/types/known/wrapperspb"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/schema"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

// stringValue is the schema of google.protobuf.StringValue, a generated
// Go type at hand (there is no protoc here to generate one).
const stringValue = "syntax = \"proto3\";\npackage google.protobuf;\nmessage StringValue {\n  string value = 1;\n}\n"

// Handler decodes into the handler's type (a struct, or a generated
// protobuf pointer type it allocates), rejects a record it cannot decode
// (a dead letter, not retries for ever), and returns a registry outage as
// an error to retry.
func TestHandlerDecodesAndRejectsWhatItCannot(t *testing.T) {
	t.Parallel()
	reg := schematest.NewStandInRegistry(t)
	s := reg.StandIn
	orders, names := reg.Name(t, "orders"), reg.Name(t, "names")
	codec, err := schema.New(outboxtest.Ctx(t), schema.Config{Client: reg.Client(t), Schemas: []schema.TopicSchema{
		{Topic: orders, Format: schema.Avro, Text: read(t, "order.avsc")},
		{Topic: names, Format: schema.Protobuf, Text: stringValue},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got order
	h := schema.Handler(codec, func(_ *message.Message, o order) error { got = o; return nil })
	m, err := codec.NewMessage(orders, order{ID: "o1", Customer: "c", Qty: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := h(m); err != nil || got.ID != "o1" || got.Qty != 4 {
		t.Fatalf("handled %+v, %v", got, err)
	}
	if err := h(message.NewMessage("bad", []byte("plain"))); !errors.Is(err, outbox.ErrPoison) || !errors.Is(err, schema.ErrMismatch) {
		t.Errorf("a record that is not in the wire format: %v, want a rejection (ErrPoison) of ErrMismatch", err)
	}

	var name string
	hp := schema.Handler(codec, func(_ *message.Message, v *wrapperspb.StringValue) error { name = v.GetValue(); return nil })
	pm, err := codec.NewMessage(names, wrapperspb.String("ada"))
	if err != nil {
		t.Fatal(err)
	}
	if err := hp(pm); err != nil || name != "ada" {
		t.Fatalf("handled %q, %v", name, err)
	}
	if err := hp(m); !errors.Is(err, outbox.ErrPoison) {
		t.Errorf("an Avro record into a protobuf type: %v, want a rejection", err)
	}

	// A Codec that has seen no id: with the registry down, the delivery is
	// retried, not rejected.
	fresh, err := schema.New(outboxtest.Ctx(t), schema.Config{Client: reg.Client(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Down(); err != nil {
		t.Fatal(err)
	}
	hf := schema.Handler(fresh, func(*message.Message, order) error { return nil })
	if err := hf(m); !errors.Is(err, schema.ErrRegistryUnavailable) || errors.Is(err, outbox.ErrPoison) {
		t.Errorf("the registry down: %v, want ErrRegistryUnavailable, not a rejection", err)
	}
	if err := schema.Handler[order](nil, nil)(m); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("a nil Codec: %v", err)
	}
	if err := schema.Handler[order](codec, nil)(m); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("a nil fn: %v", err)
	}
}
