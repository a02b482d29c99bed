package schematest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
)

func protoSchema(t *testing.T, text string) *parsed {
	t.Helper()
	p, err := parseProtobuf(text, nil)
	if err != nil {
		t.Fatalf("parse %s: %v", text, err)
	}
	return p
}

// protoOrder is a .proto file whose Order has field qty (number 3) of
// type qtyType and field shipping (number 4) of message type shipType;
// withAddress adds message Address, and nested adds Order.Line.
func protoOrder(qtyType, shipType string, withAddress, nested bool) string {
	var b strings.Builder
	b.WriteString("syntax = \"proto3\";\npackage shop.v1;\nimport \"google/protobuf/timestamp.proto\";\n")
	b.WriteString("message Location { string zip = 1; }\n")
	if withAddress {
		b.WriteString("message Address { string zip = 1; }\n")
	}
	b.WriteString("message Order {\n  string id = 1;\n  google.protobuf.Timestamp at = 2;\n")
	fmt.Fprintf(&b, "  %s qty = 3;\n  %s shipping = 4;\n  map<string, int64> totals = 5;\n", qtyType, shipType)
	if nested {
		b.WriteString("  message Line { string sku = 1; }\n  repeated Line lines = 6;\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func TestProtobufKindGroups(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		from, to   string
		compatible bool
	}{
		{"int32", "int32", true},
		{"int32", "int64", true},
		{"int32", "uint32", true},
		{"uint64", "bool", true},
		{"sint32", "sint64", true},
		{"fixed32", "sfixed32", true},
		{"fixed64", "sfixed64", true},
		{"string", "bytes", true},
		{"int32", "string", false},
		{"int32", "sint32", false},
		{"int64", "fixed64", false},
		{"fixed32", "fixed64", false},
		{"float", "double", false},
		{"string", "Location", false},
	} {
		t.Run(c.from+" to "+c.to, func(t *testing.T) {
			old := protoSchema(t, protoOrder(c.from, "Address", true, false))
			nu := protoSchema(t, protoOrder(c.to, "Address", true, false))
			probs := protoIncompatibilities(nu.proto, old.proto, "new", "old")
			if c.compatible {
				checkProblems(t, probs, "", nil)
				return
			}
			checkProblems(t, probs, "FIELD_KIND_CHANGED", []string{"message shop.v1.Order", "field qty (number 3)", c.from, c.to})
		})
	}
}

func TestProtobufCompatibility(t *testing.T) {
	t.Parallel()
	base := protoOrder("int32", "Address", true, true)
	for _, c := range []struct {
		name           string
		reader, writer string
		kind           string
		want           []string
	}{
		{name: "same schema", reader: base, writer: base},
		{name: "message removed", reader: protoOrder("int32", "Location", false, true), writer: protoOrder("int32", "Location", true, true),
			kind: "MESSAGE_REMOVED", want: []string{"message shop.v1.Address of the old schema is missing in the new schema"}},
		{name: "message added", reader: protoOrder("int32", "Location", true, true), writer: protoOrder("int32", "Location", false, true)},
		{name: "nested message removed", reader: protoOrder("int32", "Address", true, false), writer: base,
			kind: "MESSAGE_REMOVED", want: []string{"message shop.v1.Order.Line"}},
		{name: "message field changed to another message", reader: protoOrder("int32", "Location", true, true), writer: base,
			kind: "FIELD_NAMED_TYPE_CHANGED", want: []string{"message shop.v1.Order", "field shipping (number 4)", "shop.v1.Address", "shop.v1.Location"}},
		{name: "map value kind changed", reader: strings.Replace(base, "map<string, int64>", "map<string, string>", 1), writer: base,
			kind: "FIELD_KIND_CHANGED", want: []string{"field totals (number 5)", "map value", "int64", "string"}},
		{name: "field renamed, same number", reader: strings.Replace(base, "qty = 3", "quantity = 3", 1), writer: base},
		{name: "field added", reader: strings.Replace(base, "string id = 1;", "string id = 1;\n  string note = 9;", 1), writer: base},
		{name: "field removed", reader: strings.Replace(base, "string id = 1;", "", 1), writer: base},
	} {
		t.Run(c.name, func(t *testing.T) {
			probs := protoIncompatibilities(protoSchema(t, c.reader).proto, protoSchema(t, c.writer).proto, "new", "old")
			checkProblems(t, probs, c.kind, c.want)
		})
	}
}

func TestProtobufParse(t *testing.T) {
	t.Parallel()
	if _, err := parseProtobuf("syntax = \"proto3\";\nmessage Order { strin id = 1; }\n", nil); err == nil || !strings.Contains(err.Error(), "strin") {
		t.Errorf("an unknown type must be refused with the parser's message, got %v", err)
	}
	if _, err := parseProtobuf("syntax = \"proto3\";\nmessage Order { string id = 1 }\n", nil); err == nil || !strings.Contains(err.Error(), "schema.proto:2") {
		t.Errorf("a syntax error must be refused with its position, got %v", err)
	}
	if _, err := parseProtobuf("syntax = \"proto3\";\nimport \"shop/address.proto\";\nmessage Order { shop.Address a = 1; }\n", nil); err == nil {
		t.Error("an import that is neither a well-known type nor a reference must be refused")
	}
	refs := []namedSchema{{name: "shop/address.proto", schema: protoRef("syntax = \"proto3\";\npackage shop;\nmessage Address { string zip = 1; }\n")}}
	if _, err := parseProtobuf("syntax = \"proto3\";\nimport \"shop/address.proto\";\nmessage Order { shop.Address a = 1; }\n", refs); err != nil {
		t.Errorf("an import given as a reference must resolve: %v", err)
	}
}

func protoRef(text string) sr.Schema { return sr.Schema{Schema: text, Type: sr.TypeProtobuf} }
