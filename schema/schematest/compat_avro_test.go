package schematest

import (
	"strings"
	"testing"
)

func avroSchema(t *testing.T, text string) *parsed {
	t.Helper()
	p, err := parseAvro(text, nil)
	if err != nil {
		t.Fatalf("parse %s: %v", text, err)
	}
	return p
}

// avroCase is a reader/writer pair and what avroIncompatibilities must say:
// nothing (kind ""), or one problem of kind whose detail holds each of
// want.
type avroCase struct {
	name           string
	reader, writer string
	kind           string
	want           []string
}

const (
	orderV1        = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"customer","type":"string"}]}`
	orderQty       = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"customer","type":"string"},{"name":"qty","type":"int"}]}`
	orderQtyDef    = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"customer","type":"string"},{"name":"qty","type":"int","default":0}]}`
	orderCustInt   = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"customer","type":"int"}]}`
	orderIDLong    = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"long"}]}`
	orderIDInt     = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"int"}]}`
	orderAddrV1    = `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"addr","type":{"type":"record","name":"Address","fields":[{"name":"zip","type":"string"}]}}]}`
	orderAddrZip   = `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"addr","type":{"type":"record","name":"Address","fields":[{"name":"zip","type":"int"}]}}]}`
	orderLines     = `{"type":"record","name":"Order","fields":[{"name":"lines","type":{"type":"array","items":"string"}}]}`
	orderLinesInt  = `{"type":"record","name":"Order","fields":[{"name":"lines","type":{"type":"array","items":"int"}}]}`
	orderStatus3   = `{"type":"record","name":"Order","fields":[{"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID","SHIPPED"]}}]}`
	orderStatus2   = `{"type":"record","name":"Order","fields":[{"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}}]}`
	orderNoteOpt   = `{"type":"record","name":"Order","fields":[{"name":"note","type":["null","string"],"default":null}]}`
	orderNoteOptI  = `{"type":"record","name":"Order","fields":[{"name":"note","type":["null","int"],"default":null}]}`
	orderRenamed   = `{"type":"record","name":"Purchase","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"customer","type":"string"}]}`
	orderAliasedID = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"order_id","aliases":["id"],"type":"string"},{"name":"customer","type":"string"}]}`
	listV1         = `{"type":"record","name":"Node","fields":[{"name":"value","type":"string"},{"name":"next","type":["null","Node"],"default":null}]}`
	listV2         = `{"type":"record","name":"Node","fields":[{"name":"value","type":"int"},{"name":"next","type":["null","Node"],"default":null}]}`
)

func TestAvroCompatibility(t *testing.T) {
	t.Parallel()
	for _, c := range []avroCase{
		{name: "same schema", reader: orderV1, writer: orderV1},
		{name: "reader adds a field without default", reader: orderQty, writer: orderV1,
			kind: "READER_FIELD_MISSING_DEFAULT_VALUE", want: []string{"field qty (path /fields/2) has no default value and is missing in the old schema"}},
		{name: "reader adds a field with a default", reader: orderQtyDef, writer: orderV1},
		{name: "reader drops a field", reader: orderV1, writer: orderQty},
		{name: "field type changed", reader: orderCustInt, writer: orderV1,
			kind: "TYPE_MISMATCH", want: []string{"field customer", "/fields/1/type", "int", "string"}},
		{name: "int promoted to long", reader: orderIDLong, writer: orderIDInt},
		{name: "long not demoted to int", reader: orderIDInt, writer: orderIDLong,
			kind: "TYPE_MISMATCH", want: []string{"field id", "/fields/0/type"}},
		{name: "nested record field changed", reader: orderAddrZip, writer: orderAddrV1,
			kind: "TYPE_MISMATCH", want: []string{"field zip", "/fields/1/type/fields/0/type"}},
		{name: "array items changed", reader: orderLinesInt, writer: orderLines,
			kind: "TYPE_MISMATCH", want: []string{"items of the type of field lines", "/fields/0/type/items"}},
		{name: "enum lost a symbol the writer has", reader: orderStatus2, writer: orderStatus3,
			kind: "MISSING_ENUM_SYMBOLS", want: []string{"field status", "SHIPPED"}},
		{name: "enum gained a symbol", reader: orderStatus3, writer: orderStatus2},
		{name: "union lost a branch", reader: orderNoteOptI, writer: orderNoteOpt,
			kind: "MISSING_UNION_BRANCH", want: []string{"field note", "/fields/0/type"}},
		{name: "record renamed", reader: orderRenamed, writer: orderV1,
			kind: "NAME_MISMATCH", want: []string{"path /", "Purchase", "Order"}},
		{name: "field renamed with an alias", reader: orderAliasedID, writer: orderV1},
	} {
		t.Run(c.name, func(t *testing.T) {
			probs := avroIncompatibilities(avroSchema(t, c.reader).avro, avroSchema(t, c.writer).avro, "new", "old")
			checkProblems(t, probs, c.kind, c.want)
		})
	}
}

// checkProblems fails unless probs is empty (kind "") or one problem of
// kind whose detail holds each of want.
func checkProblems(t *testing.T, probs []problem, kind string, want []string) {
	t.Helper()
	if kind == "" {
		if len(probs) > 0 {
			t.Fatalf("compatible pair reported incompatible: %+v", probs)
		}
		return
	}
	if len(probs) != 1 {
		t.Fatalf("want one %s problem, got %+v", kind, probs)
	}
	if probs[0].kind != kind {
		t.Errorf("kind %s, want %s (%s)", probs[0].kind, kind, probs[0].detail)
	}
	for _, w := range want {
		if !strings.Contains(probs[0].detail, w) {
			t.Errorf("detail %q does not say %q", probs[0].detail, w)
		}
	}
}

// The roles name the schemas: checking FORWARD swaps reader and writer,
// and the detail says which schema lacks the field.
func TestAvroDetailsNameTheRoles(t *testing.T) {
	t.Parallel()
	probs := avroIncompatibilities(avroSchema(t, orderQty).avro, avroSchema(t, orderV1).avro, "old", "new")
	checkProblems(t, probs, "READER_FIELD_MISSING_DEFAULT_VALUE", []string{"field qty (path /fields/2) has no default value and is missing in the new schema"})
}

// Every field that breaks is reported, not only the first.
func TestAvroReportsEveryBrokenField(t *testing.T) {
	t.Parallel()
	reader := `{"type":"record","name":"Order","fields":[{"name":"id","type":"int"},{"name":"qty","type":"int"}]}`
	writer := `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"}]}`
	probs := avroIncompatibilities(avroSchema(t, reader).avro, avroSchema(t, writer).avro, "new", "old")
	if len(probs) != 2 || !strings.Contains(probs[0].detail, "field id") || !strings.Contains(probs[1].detail, "field qty") {
		t.Fatalf("want the problems of id and qty, got %+v", probs)
	}
}

// A recursive type that changed is reported where it changed (and where
// it recurses), and the walk ends.
func TestAvroRecursiveTypeChanged(t *testing.T) {
	t.Parallel()
	probs := avroIncompatibilities(avroSchema(t, listV2).avro, avroSchema(t, listV1).avro, "new", "old")
	if len(probs) == 0 || probs[0].kind != "TYPE_MISMATCH" || !strings.Contains(probs[0].detail, "field value (path /fields/0/type)") {
		t.Fatalf("want the change of field value first, got %+v", probs)
	}
	if probs := avroIncompatibilities(avroSchema(t, listV1).avro, avroSchema(t, listV1).avro, "new", "old"); len(probs) > 0 {
		t.Fatalf("a recursive type is compatible with itself, got %+v", probs)
	}
}
