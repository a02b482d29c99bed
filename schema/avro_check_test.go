package schema

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
)

// everyAvroType is a schema with a value of every Avro type: primitives,
// logical types, a nested and a recursive record, enum, array, map, union,
// fixed, and a named type used again by reference.
const everyAvroType = `{
  "type": "record", "name": "Every", "namespace": "t",
  "fields": [
    {"name": "n", "type": "null"},
    {"name": "b", "type": "boolean"},
    {"name": "i", "type": "int"},
    {"name": "l", "type": "long"},
    {"name": "f", "type": "float"},
    {"name": "d", "type": "double"},
    {"name": "by", "type": "bytes"},
    {"name": "s", "type": "string"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}},
    {"name": "e2", "type": "Color"},
    {"name": "a", "type": {"type": "array", "items": "string"}},
    {"name": "m", "type": {"type": "map", "values": "long"}},
    {"name": "u", "type": ["null", "string", "long"]},
    {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
    {"name": "list", "type": ["null", {"type": "record", "name": "Node", "fields": [
      {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}]}
  ]
}`

func everyValue() map[string]any {
	return map[string]any{
		"n": nil, "b": true, "i": -42, "l": int64(1) << 40, "f": float32(1.5), "d": 2.25,
		"by": []byte{0, 1, 2, 255}, "s": "héllo",
		"ts": int64(1_780_000_000_000), "dec": []byte{0x01, 0x02},
		"e": "GREEN", "e2": "BLUE",
		"a": []any{"x", "", "yz"}, "m": map[string]any{"k": int64(7), "": int64(-1)},
		"u": map[string]any{"string": "branch"}, "fx": [4]byte{9, 8, 7, 6},
		"list": map[string]any{"t.Node": map[string]any{"v": 1, "next": map[string]any{"t.Node": map[string]any{"v": 2, "next": nil}}}},
	}
}

// decodes is what the check must agree with: the record decodes with the
// schema (hamba/avro's generic decoding) and is all of b.
func decodes(s avro.Schema, b []byte) bool {
	r := avro.NewReader(nil, 0).Reset(b)
	var v any
	r.ReadVal(s, &v)
	if r.Error != nil {
		return false
	}
	r.Peek()
	return r.Error != nil
}

// The check accepts exactly the bodies that decode: the record itself, and
// of every truncation and every one-byte change of it, those (and only
// those) that still decode as one record.
func TestAvroCheckAgreesWithDecoding(t *testing.T) {
	s := avro.MustParse(everyAvroType)
	record, err := avro.Marshal(s, everyValue())
	if err != nil {
		t.Fatal(err)
	}
	if err := checkAvroRecord(s, record); err != nil {
		t.Fatalf("the record is refused: %v", err)
	}
	check := func(what string, b []byte) {
		t.Helper()
		err := checkAvroRecord(s, b)
		if want := decodes(s, b); (err == nil) != want {
			t.Errorf("%s (% x): check says %v, decoding says ok=%v", what, b, err, want)
		}
	}
	refused := 0
	for n := range len(record) {
		check("truncated", record[:n])
		if checkAvroRecord(s, record[:n]) != nil {
			refused++
		}
	}
	if refused != len(record) {
		t.Errorf("%d of %d truncations refused: each is short of a value", refused, len(record))
	}
	check("one byte more", append(bytes.Clone(record), 0))
	for i := range record {
		for _, v := range []byte{0x00, 0x01, 0x02, 0x07, 0x7f, 0x80, 0xff, record[i] ^ 0x40} {
			b := bytes.Clone(record)
			b[i] = v
			check("changed", b)
		}
	}
}

// Values the check must refuse, each with what it says.
func TestAvroCheckRefuses(t *testing.T) {
	enum := avro.MustParse(`{"type": "enum", "name": "C", "symbols": ["A", "B"]}`)
	union := avro.MustParse(`["null", "int"]`)
	str := avro.MustParse(`"string"`)
	nulls := avro.MustParse(`{"type": "array", "items": "null"}`)
	for _, tc := range []struct {
		name string
		s    avro.Schema
		body []byte
		says string
	}{
		{"enum symbol out of range", enum, []byte{0x04}, "no symbol 2"},
		{"negative enum symbol", enum, []byte{0x01}, "no symbol -1"},
		{"union branch out of range", union, []byte{0x04}, "no branch 2"},
		{"negative string length", str, []byte{0x03}, "negative string length"},
		{"string longer than the body", str, []byte{0x0a, 'a'}, "EOF"},
		{"varint that does not end", avro.MustParse(`"long"`), bytes.Repeat([]byte{0xff}, 11), "long"},
		{"forged block count of nulls", nulls, []byte{0xfe, 0xff, 0xff, 0xff, 0x0f, 0x00}, "does not fit"},
		{"empty body", str, nil, "EOF"},
	} {
		err := checkAvroRecord(tc.s, tc.body)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.says)
		}
	}
	// Nulls take no byte: a count the body cannot hold is still fine up
	// to maxZeroWidthItems.
	if err := checkAvroRecord(nulls, []byte{0xc8, 0x01, 0x00}); err != nil {
		t.Errorf("100 nulls: %v", err)
	}
}

// A recursive record nested deeper than maxAvroDepth is refused, not
// followed down the stack.
func TestAvroCheckBoundsNesting(t *testing.T) {
	s := avro.MustParse(`{"type": "record", "name": "N", "fields": [{"name": "next", "type": ["null", "N"]}]}`)
	deep := append(bytes.Repeat([]byte{0x02}, maxAvroDepth+10), 0x00)
	if err := checkAvroRecord(s, deep); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Errorf("%d levels: %v", maxAvroDepth+10, err)
	}
	shallow := append(bytes.Repeat([]byte{0x02}, 10), 0x00)
	if err := checkAvroRecord(s, shallow); err != nil {
		t.Errorf("10 levels: %v", err)
	}
}

// Checking a record allocates nothing.
func TestAvroCheckAllocatesNothing(t *testing.T) {
	s := avro.MustParse(everyAvroType)
	record, err := avro.Marshal(s, everyValue())
	if err != nil {
		t.Fatal(err)
	}
	_ = checkAvroRecord(s, record) // the pool's reader
	if n := testing.AllocsPerRun(100, func() { _ = checkAvroRecord(s, record) }); n > 0 {
		t.Errorf("%v allocations per check", n)
	}
}
