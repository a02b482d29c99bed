package schema

import (
	"os"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type order struct {
	ID       string  `avro:"id" json:"id"`
	Customer string  `avro:"customer" json:"customer"`
	Qty      int32   `avro:"qty" json:"qty"`
	Note     *string `avro:"note" json:"note,omitempty"`
}

// Each format names its record as the RecordName strategies need it, and
// a schema that does not parse is an error that says where.
func TestCompileNamesTheRecordAndRefusesBadText(t *testing.T) {
	for _, tc := range []struct {
		f      Format
		text   string
		record string
	}{
		{Avro, read(t, "order.avsc"), "shop.Order"},
		{Protobuf, read(t, "order.proto"), "shop.Order"},
		{JSONSchema, read(t, "order.schema.json"), "shop.Order"},
	} {
		c, err := compile(tc.f, tc.text, "", nil)
		if err != nil {
			t.Fatalf("%v: %v", tc.f, err)
		}
		if c.record() != tc.record {
			t.Errorf("%v: record %q, want %q", tc.f, c.record(), tc.record)
		}
	}
	for _, tc := range []struct {
		f    Format
		text string
		want string
	}{
		{Avro, `{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "strin"}]}`, "strin"},
		{Protobuf, "syntax = \"proto3\";\nmessage Order {\n  strin id = 1;\n}\n", "strin"},
		{JSONSchema, `{"type": "objec"}`, "objec"},
		{JSONSchema, `{"type": `, "JSON"},
		{Protobuf, "syntax = \"proto3\";\n", "no message"},
	} {
		if _, err := compile(tc.f, tc.text, "", nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %q: %v, want an error naming %q", tc.f, tc.text, err, tc.want)
		}
	}
}

// Avro: a record of the schema passes; bytes that are another record's,
// truncated, or with bytes left over do not.
func TestAvroValidation(t *testing.T) {
	c, err := compileAvro(read(t, "order.avsc"))
	if err != nil {
		t.Fatal(err)
	}
	good, err := avro.Marshal(c.schema, order{ID: "o1", Customer: "c1", Qty: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.validate(good); err != nil {
		t.Fatalf("a record of the schema: %v", err)
	}
	for name, body := range map[string][]byte{
		"truncated":        good[:len(good)-1],
		"left over":        append(append([]byte{}, good...), 0x02),
		"empty":            nil,
		"bad union":        append(good[:len(good)-1], 0x08), // union branch 4 of 2
		"JSON, not binary": []byte(`{"id":"o1","customer":"c1","qty":3}`),
	} {
		if err := c.validate(body); err == nil {
			t.Errorf("%s: validated", name)
		}
	}
	// A Go value of the wrong type cannot be encoded.
	if _, err := c.encode(nil, struct{ X chan int }{}); err == nil {
		t.Error("a struct without the schema's fields was encoded")
	}
	var back order
	enc, err := c.encode(nil, order{ID: "o2", Customer: "c2", Qty: 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.decode(enc, &back); err != nil || back.ID != "o2" || back.Qty != 5 {
		t.Fatalf("decode: %+v, %v", back, err)
	}
	js, err := c.json(enc)
	if err != nil || !strings.Contains(string(js), `"qty":5`) {
		t.Fatalf("json: %s, %v", js, err)
	}
}

// Protobuf: a record of the message passes; one with a field the schema
// does not define, or with a field of the wrong wire type, does not; a Go
// value of another message is refused.
func TestProtobufValidation(t *testing.T) {
	c, err := compileProtobuf(read(t, "order.proto"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.index(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("index of the first message: %v", got)
	}
	m := dynamicpb.NewMessage(c.desc)
	m.Set(c.desc.Fields().ByName("id"), protoreflect.ValueOfString("o1"))
	m.Set(c.desc.Fields().ByName("qty"), protoreflect.ValueOfInt32(3))
	line := m.Mutable(c.desc.Fields().ByName("lines")).List().NewElement()
	line.Message().Set(line.Message().Descriptor().Fields().ByName("sku"), protoreflect.ValueOfString("s1"))
	m.Mutable(c.desc.Fields().ByName("lines")).List().Append(line)
	good, err := c.encode(nil, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.validate(good); err != nil {
		t.Fatalf("a record of the message: %v", err)
	}
	unknown := append(append([]byte{}, good...), 0x48, 0x01) // field 9, varint 1
	if err := c.validate(unknown); err == nil || !strings.Contains(err.Error(), "does not define") {
		t.Errorf("a record with field 9: %v", err)
	}
	wrongWire := []byte{0x18, 0x01, 0x1a, 0x00}[2:] // field 3 (qty) as length-delimited
	if err := c.validate(wrongWire); err == nil {
		t.Error("qty as a length-delimited field validated")
	}
	if _, err := c.encode(nil, wrapperspb.String("x")); err == nil || !strings.Contains(err.Error(), "google.protobuf.StringValue is not a shop.Order") {
		t.Errorf("encoding another message: %v", err)
	}
	if _, err := c.encode(nil, "a string"); err == nil {
		t.Error("encoding a string as a message")
	}
	nested, err := compileProtobuf(read(t, "order.proto"), "shop.Order.Line", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := nested.index(); len(got) != 2 || got[0] != 0 || got[1] != 0 {
		t.Errorf("index of shop.Order.Line: %v, want [0 0]", got)
	}
	byIndex, err := compileProtobuf(read(t, "order.proto"), "", []int{1})
	if err != nil || byIndex.record() != "shop.Refund" {
		t.Errorf("message at index [1]: %v, %v", byIndex, err)
	}
	if _, err := compileProtobuf(read(t, "order.proto"), "shop.Nope", nil); err == nil {
		t.Error("an unknown message name compiled")
	}
	back := dynamicpb.NewMessage(c.desc)
	if err := c.decode(good, back); err != nil || !proto.Equal(back, m) {
		t.Fatalf("decode: %v", err)
	}
	js, err := c.json(good)
	if err != nil || !strings.Contains(string(js), `"sku":"s1"`) {
		t.Fatalf("json: %s, %v", js, err)
	}
}

// A Go type generated from another version of the schema (a field the
// registered schema lacks, or of another kind) is refused by name.
func TestProtobufGoTypeMustAgreeWithTheSchema(t *testing.T) {
	registered, err := compileProtobuf("syntax = \"proto3\";\npackage shop;\nmessage Order { string id = 1; }\n", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	newer, err := compileProtobuf("syntax = \"proto3\";\npackage shop;\nmessage Order { string id = 1; int32 qty = 3; }\n", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registered.encode(nil, dynamicpb.NewMessage(newer.desc)); err == nil || !strings.Contains(err.Error(), "qty (number 3)") {
		t.Errorf("a value with a field the schema lacks: %v", err)
	}
	otherKind, err := compileProtobuf("syntax = \"proto3\";\npackage shop;\nmessage Order { int64 id = 1; }\n", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registered.encode(nil, dynamicpb.NewMessage(otherKind.desc)); err == nil || !strings.Contains(err.Error(), "int64") {
		t.Errorf("a value whose field has another kind: %v", err)
	}
}

// JSON Schema: the validator's reason names the property.
func TestJSONSchemaValidation(t *testing.T) {
	c, err := compileJSONSchema(read(t, "order.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.validate([]byte(`{"id":"o1","qty":2}`)); err != nil {
		t.Fatal(err)
	}
	for body, want := range map[string]string{
		`{"id":"o1"}`:         "qty",
		`{"id":"o1","qty":0}`: "minimum",
		`{"id":1,"qty":2}`:    "string",
		`{"id":"o1","qty":2`:  "not JSON",
		`["id"]`:              "object",
	} {
		if err := c.validate([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", body, err, want)
		}
	}
	if _, err := c.encode(nil, order{ID: "o1"}); err == nil || !strings.Contains(err.Error(), "minimum") {
		t.Errorf("a value with qty 0: %v", err)
	}
	if _, err := c.encode(nil, make(chan int)); err == nil {
		t.Error("a channel was encoded")
	}
}

// The JSON of an Avro record is for people: markup stays as written (the
// CLI and the console escape it for their output).
func TestAvroJSONKeepsMarkupAsWritten(t *testing.T) {
	c, err := compileAvro(read(t, "order.avsc"))
	if err != nil {
		t.Fatal(err)
	}
	body, err := c.encode(nil, order{ID: "<script>&", Customer: "c", Qty: 1})
	if err != nil {
		t.Fatal(err)
	}
	js, err := c.json(body)
	if err != nil || !strings.Contains(string(js), `"id":"<script>&"`) || strings.HasSuffix(string(js), "\n") {
		t.Fatalf("json: %q, %v", js, err)
	}
}
