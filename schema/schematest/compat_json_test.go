package schematest

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
)

func jsonSchema(t *testing.T, text string) *parsed {
	t.Helper()
	p, err := parseJSON(text, nil)
	if err != nil {
		t.Fatalf("parse %s: %v", text, err)
	}
	return p
}

const (
	jsonOrder         = `{"type":"object","properties":{"id":{"type":"string"},"qty":{"type":"integer"}},"required":["id"]}`
	jsonOrderQtyStr   = `{"type":"object","properties":{"id":{"type":"string"},"qty":{"type":"string"}},"required":["id"]}`
	jsonOrderQtyNum   = `{"type":"object","properties":{"id":{"type":"string"},"qty":{"type":"number"}},"required":["id"]}`
	jsonOrderQtyNull  = `{"type":"object","properties":{"id":{"type":"string"},"qty":{"type":["integer","null"]}},"required":["id"]}`
	jsonOrderQtyReq   = `{"type":"object","properties":{"id":{"type":"string"},"qty":{"type":"integer"}},"required":["id","qty"]}`
	jsonOrderNote     = `{"type":"object","properties":{"id":{"type":"string"},"qty":{"type":"integer"},"note":{"type":"string"}},"required":["id"]}`
	jsonOrderCust     = `{"type":"object","properties":{"customer":{"type":"object","properties":{"id":{"type":"string"}}}}}`
	jsonOrderCustInt  = `{"type":"object","properties":{"customer":{"type":"object","properties":{"id":{"type":"integer"}}}}}`
	jsonOrderLines    = `{"type":"object","properties":{"lines":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"}}}}}}`
	jsonOrderLinesInt = `{"type":"object","properties":{"lines":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"integer"}}}}}}`
	jsonOrderNoType   = `{"type":"object","properties":{"id":{"type":"string"},"qty":{}},"required":["id"]}`
)

func TestJSONCompatibility(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name           string
		reader, writer string
		kind           string
		want           []string
	}{
		{name: "same schema", reader: jsonOrder, writer: jsonOrder},
		{name: "property type changed", reader: jsonOrderQtyStr, writer: jsonOrder,
			kind: "TYPE_CHANGED", want: []string{`property qty (path /properties/qty) has type "integer" in the old schema and "string" in the new schema`}},
		{name: "integer widened to number", reader: jsonOrderQtyNum, writer: jsonOrder},
		{name: "number narrowed to integer", reader: jsonOrder, writer: jsonOrderQtyNum,
			kind: "TYPE_NARROWED", want: []string{"property qty", "/properties/qty"}},
		{name: "type list gained null", reader: jsonOrderQtyNull, writer: jsonOrder},
		{name: "type list lost null", reader: jsonOrder, writer: jsonOrderQtyNull,
			kind: "TYPE_NARROWED", want: []string{"property qty"}},
		{name: "type constraint dropped", reader: jsonOrderNoType, writer: jsonOrder},
		{name: "type constraint added", reader: jsonOrder, writer: jsonOrderNoType,
			kind: "TYPE_NARROWED", want: []string{"property qty", "(any)"}},
		{name: "property newly required", reader: jsonOrderQtyReq, writer: jsonOrder,
			kind: "REQUIRED_ATTRIBUTE_ADDED", want: []string{"property qty (path /properties/qty) is required in the new schema but not in the old schema"}},
		{name: "property no longer required", reader: jsonOrder, writer: jsonOrderQtyReq},
		{name: "optional property added", reader: jsonOrderNote, writer: jsonOrder},
		{name: "nested property type changed", reader: jsonOrderCustInt, writer: jsonOrderCust,
			kind: "TYPE_CHANGED", want: []string{"property id (path /properties/customer/properties/id)"}},
		{name: "array item property type changed", reader: jsonOrderLinesInt, writer: jsonOrderLines,
			kind: "TYPE_CHANGED", want: []string{"property sku (path /properties/lines/items/properties/sku)"}},
		{name: "root type changed", reader: `{"type":"array"}`, writer: `{"type":"object"}`,
			kind: "TYPE_CHANGED", want: []string{"the schema (path /)"}},
		{name: "boolean schemas", reader: `true`, writer: `false`},
	} {
		t.Run(c.name, func(t *testing.T) {
			probs := jsonIncompatibilities(jsonSchema(t, c.reader).json, jsonSchema(t, c.writer).json, "new", "old")
			checkProblems(t, probs, c.kind, c.want)
		})
	}
}

// FORWARD swaps the roles: a property the new schema no longer requires
// breaks the old reader.
func TestJSONRequiredForward(t *testing.T) {
	t.Parallel()
	probs := jsonIncompatibilities(jsonSchema(t, jsonOrderQtyReq).json, jsonSchema(t, jsonOrder).json, "old", "new")
	checkProblems(t, probs, "REQUIRED_ATTRIBUTE_ADDED", []string{"property qty (path /properties/qty) is required in the old schema but not in the new schema"})
}

func TestJSONParse(t *testing.T) {
	t.Parallel()
	for _, text := range []string{`{"type": 5}`, `{"type":"object","properties":{"qty":{"type":"integr"}}}`, `{"type":`, `{"$ref":"https://example.com/other.json"}`} {
		if _, err := parseJSON(text, nil); err == nil {
			t.Errorf("%s: want an error", text)
		}
	}
	if _, err := parseJSON(`{"type":`, nil); err == nil || !strings.Contains(err.Error(), "EOF") {
		t.Errorf("a truncated document must be refused with the parser's message, got %v", err)
	}
	ref := []namedSchema{{name: "customer.json", schema: jsonRef(`{"type":"object","properties":{"id":{"type":"string"}}}`)}}
	if _, err := parseJSON(`{"type":"object","properties":{"customer":{"$ref":"customer.json"}}}`, ref); err != nil {
		t.Errorf("a $ref to a reference must resolve: %v", err)
	}
}

func jsonRef(text string) sr.Schema { return sr.Schema{Schema: text, Type: sr.TypeJSON} }
