package schematest_test

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
)

// Each level, at registration, with a pair that is backward but not
// forward compatible (v1 -> orderNoNote), one that is forward but not
// backward compatible (v1 -> orderQty), and one that is both (v1 ->
// orderQtyDef).
func TestLevelsAtRegistration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		level                     sr.CompatibilityLevel
		backwardOnly, forwardOnly bool // registers
	}{
		{sr.CompatNone, true, true},
		{sr.CompatBackward, true, false},
		{sr.CompatBackwardTransitive, true, false},
		{sr.CompatForward, false, true},
		{sr.CompatForwardTransitive, false, true},
		{sr.CompatFull, false, false},
		{sr.CompatFullTransitive, false, false},
	} {
		t.Run(c.level.String(), func(t *testing.T) {
			t.Parallel()
			r, cl := setup(t)
			for _, p := range []struct {
				next      string
				registers bool
				names     string
			}{
				{orderNoNote, c.backwardOnly, "note"},
				{orderQty, c.forwardOnly, "qty"},
				{orderQtyDef, true, ""},
			} {
				s := subject(t, r, cl, "orders")
				setLevel(t, cl, s, c.level)
				register(t, cl, s, avroSchema(orderV1))
				_, err := cl.RegisterSchema(t.Context(), s, avroSchema(p.next), -1, -1)
				if p.registers {
					if err != nil {
						t.Errorf("%s: %v", p.next, err)
					}
					continue
				}
				wantIncompatible(t, err, s, p.names)
			}
		})
	}
}

// The stand-in's message names the field and what broke, in Confluent's
// shape.
func TestIncompatibleMessage(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	if r.External() {
		t.Skip("the stand-in's wording")
	}
	s := subject(t, r, cl, "orders")
	register(t, cl, s, avroSchema(orderV1))
	_, err := cl.RegisterSchema(t.Context(), s, avroSchema(orderQty), -1, -1)
	re := wantIncompatible(t, err, s)
	want := `Schema being registered is incompatible with an earlier schema for subject "` + s + `", details: [{errorType:'READER_FIELD_MISSING_DEFAULT_VALUE', description:'field qty (path /fields/2) has no default value and is missing in the old schema'}, {oldSchemaVersion: 1}, {compatibility: 'BACKWARD'}]`
	if re.Message != want {
		t.Errorf("message\n%s\nwant\n%s", re.Message, want)
	}
}

// v1 -> v2 (qty with a default) -> v3 (qty without): v3 reads v2's data
// but not v1's, so the latest-only levels take it and the transitive ones
// refuse it, naming qty.
func TestTransitiveAgainstEveryVersion(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	for _, c := range []struct {
		level     sr.CompatibilityLevel
		registers bool
	}{
		{sr.CompatBackward, true},
		{sr.CompatBackwardTransitive, false},
		{sr.CompatFull, true},
		{sr.CompatFullTransitive, false},
	} {
		s := subject(t, r, cl, "orders")
		setLevel(t, cl, s, c.level)
		register(t, cl, s, avroSchema(orderV1))
		register(t, cl, s, avroSchema(orderQtyDef))
		_, err := cl.RegisterSchema(t.Context(), s, avroSchema(orderQty), -1, -1)
		switch {
		case c.registers && err != nil:
			t.Errorf("%s: %v", c.level, err)
		case !c.registers:
			wantIncompatible(t, err, s, "qty")
		}
	}
	// FORWARD_TRANSITIVE: v1 (note) -> v2 (note with a default) -> v3
	// (no note): v2 reads v3's data, v1 does not.
	noteDef := `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"note","type":"string","default":""}]}`
	for _, c := range []struct {
		level     sr.CompatibilityLevel
		registers bool
	}{
		{sr.CompatForward, true},
		{sr.CompatForwardTransitive, false},
	} {
		s := subject(t, r, cl, "orders")
		setLevel(t, cl, s, c.level)
		register(t, cl, s, avroSchema(orderV1))
		register(t, cl, s, avroSchema(noteDef))
		_, err := cl.RegisterSchema(t.Context(), s, avroSchema(orderNoNote), -1, -1)
		switch {
		case c.registers && err != nil:
			t.Errorf("%s: %v", c.level, err)
		case !c.registers:
			wantIncompatible(t, err, s, "note")
		}
	}
}

// The compatibility endpoint: against one version, the latest, or the
// versions the level names; verbose answers say why.
func TestCheckCompatibility(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	ctx := t.Context()
	s := subject(t, r, cl, "orders")
	setLevel(t, cl, s, sr.CompatBackward)
	register(t, cl, s, avroSchema(orderV1))
	register(t, cl, s, avroSchema(orderQtyDef))
	candidate := avroSchema(orderQty)

	check := func(version int, verbose bool) sr.CheckCompatibilityResult {
		t.Helper()
		c := ctx
		if verbose {
			c = sr.WithParams(ctx, sr.Verbose)
		}
		res, err := cl.CheckCompatibility(c, s, version, candidate)
		if err != nil {
			t.Fatalf("CheckCompatibility(%d): %v", version, err)
		}
		return res
	}
	if res := check(-1, false); !res.Is {
		t.Errorf("against the latest: %+v, want compatible", res)
	}
	if res := check(-2, false); !res.Is {
		t.Errorf("against the versions BACKWARD names (the latest): %+v, want compatible", res)
	}
	if res := check(1, false); res.Is || len(res.Messages) != 0 {
		t.Errorf("against version 1, not verbose: %+v, want incompatible without messages", res)
	}
	res := check(1, true)
	if res.Is || !strings.Contains(strings.Join(res.Messages, "\n"), "qty") {
		t.Errorf("against version 1, verbose: %+v, want incompatible, naming qty", res)
	}
	setLevel(t, cl, s, sr.CompatBackwardTransitive)
	if res := check(-2, true); res.Is || !strings.Contains(strings.Join(res.Messages, "\n"), "qty") {
		t.Errorf("against every version (BACKWARD_TRANSITIVE): %+v, want incompatible, naming qty", res)
	}
	setLevel(t, cl, s, sr.CompatNone)
	if res := check(1, true); !res.Is {
		t.Errorf("level NONE: %+v, want compatible", res)
	}

	if _, err := cl.CheckCompatibility(ctx, s, 9, candidate); err == nil {
		t.Error("version 9 does not exist")
	} else {
		responseError(t, err, 404, sr.ErrVersionNotFound.Code)
	}
	_, err := cl.CheckCompatibility(ctx, s, -1, avroSchema(`{"type":"recrod"}`))
	responseError(t, err, 422, sr.ErrInvalidSchema.Code)
}

func TestProtobufIncompatibleChanges(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	const v1 = `syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
message Address { string zip = 1; }
message Order {
  string id = 1;
  int32 qty = 2;
  Address shipping = 3;
  google.protobuf.Timestamp placed_at = 4;
}
`
	for _, c := range []struct {
		name, next string
		names      []string // what the stand-in's message names
	}{
		{"qty became a string", strings.Replace(v1, "int32 qty", "string qty", 1), []string{"shop.v1.Order", "field qty (number 2)", "int32", "string"}},
		{"Address removed", strings.NewReplacer("message Address { string zip = 1; }\n", "", "Address shipping", "string shipping").Replace(v1), []string{"shop.v1.Address"}},
	} {
		s := subject(t, r, cl, "orders")
		setLevel(t, cl, s, sr.CompatBackward)
		register(t, cl, s, sr.Schema{Type: sr.TypeProtobuf, Schema: v1})
		_, err := cl.RegisterSchema(t.Context(), s, sr.Schema{Type: sr.TypeProtobuf, Schema: c.next}, -1, -1)
		if r.External() {
			wantIncompatible(t, err, s)
		} else {
			wantIncompatible(t, err, s, c.names...)
		}
	}
	s := subject(t, r, cl, "orders")
	setLevel(t, cl, s, sr.CompatBackward)
	register(t, cl, s, sr.Schema{Type: sr.TypeProtobuf, Schema: v1})
	register(t, cl, s, sr.Schema{Type: sr.TypeProtobuf, Schema: strings.Replace(v1, "int32 qty", "int64 qty", 1)})
}

func TestJSONIncompatibleChanges(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	const v1 = `{"type":"object","properties":{"id":{"type":"string"},"qty":{"type":"integer"}},"required":["id"]}`
	for _, c := range []struct {
		name, next string
		names      []string
	}{
		{"qty became a string", `{"type":"object","properties":{"id":{"type":"string"},"qty":{"type":"string"}},"required":["id"]}`, []string{"property qty (path /properties/qty)"}},
		{"qty newly required", `{"type":"object","properties":{"id":{"type":"string"},"qty":{"type":"integer"}},"required":["id","qty"]}`, []string{"property qty (path /properties/qty) is required"}},
	} {
		s := subject(t, r, cl, "orders")
		setLevel(t, cl, s, sr.CompatBackward)
		register(t, cl, s, sr.Schema{Type: sr.TypeJSON, Schema: v1})
		_, err := cl.RegisterSchema(t.Context(), s, sr.Schema{Type: sr.TypeJSON, Schema: c.next}, -1, -1)
		if r.External() {
			wantIncompatible(t, err, s)
		} else {
			wantIncompatible(t, err, s, c.names...)
		}
	}
}
