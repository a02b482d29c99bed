package schematest_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
)

// jsonEqual says whether two JSON texts hold the same value (a registry
// may give a schema back canonicalized).
func jsonEqual(t *testing.T, a, b string) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal([]byte(a), &va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal([]byte(b), &vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

func TestCreateAndRead(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	ctx := t.Context()
	s := subject(t, r, cl, "orders")

	created, err := cl.CreateSchema(ctx, s, avroSchema(orderV1))
	if err != nil {
		t.Fatal(err)
	}
	if created.Subject != s || created.Version != 1 || created.ID <= 0 || !jsonEqual(t, created.Schema.Schema, orderV1) {
		t.Fatalf("CreateSchema: %+v", created)
	}
	v2 := register(t, cl, s, avroSchema(orderQtyDef))
	if v2 == created.ID {
		t.Fatalf("a new schema got the id of another: %d", v2)
	}

	if versions, err := cl.SubjectVersions(ctx, s); err != nil || !slices.Equal(versions, []int{1, 2}) {
		t.Fatalf("SubjectVersions: %v %v", versions, err)
	}
	latest, err := cl.SchemaByVersion(ctx, s, -1)
	if err != nil || latest.Version != 2 || latest.ID != v2 || latest.Subject != s || !jsonEqual(t, latest.Schema.Schema, orderQtyDef) {
		t.Fatalf("latest: %+v %v", latest, err)
	}
	first, err := cl.SchemaByVersion(ctx, s, 1)
	if err != nil || first.ID != created.ID || first.Type != sr.TypeAvro {
		t.Fatalf("version 1: %+v %v", first, err)
	}
	if text, err := cl.SchemaTextByVersion(ctx, s, 1); err != nil || !jsonEqual(t, text, orderV1) {
		t.Fatalf("SchemaTextByVersion: %s %v", text, err)
	}
	if _, err := cl.SchemaByVersion(ctx, s, 7); err == nil {
		t.Fatal("version 7 does not exist")
	} else {
		responseError(t, err, 404, sr.ErrVersionNotFound.Code)
	}

	byID, err := cl.SchemaByID(ctx, v2)
	if err != nil || !jsonEqual(t, byID.Schema, orderQtyDef) || byID.Type != sr.TypeAvro {
		t.Fatalf("SchemaByID: %+v %v", byID, err)
	}
	if text, err := cl.SchemaTextByID(ctx, v2); err != nil || !jsonEqual(t, text, orderQtyDef) {
		t.Fatalf("SchemaTextByID: %s %v", text, err)
	}
	if subjects, err := cl.SubjectsByID(ctx, v2); err != nil || !slices.Equal(subjects, []string{s}) {
		t.Fatalf("SubjectsByID: %v %v", subjects, err)
	}
	if svs, err := cl.SchemaVersionsByID(ctx, v2); err != nil || !slices.Equal(svs, []sr.SubjectVersion{{Subject: s, Version: 2}}) {
		t.Fatalf("SchemaVersionsByID: %v %v", svs, err)
	}
	if _, err := cl.SchemaByID(ctx, 1<<30); err == nil {
		t.Fatal("an unknown id must not be found")
	} else {
		responseError(t, err, 404, sr.ErrSchemaNotFound.Code)
	}

	subjects, err := cl.Subjects(ctx)
	if err != nil || !slices.Contains(subjects, s) {
		t.Fatalf("Subjects: %v %v", subjects, err)
	}
}

func TestLookup(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	ctx := t.Context()
	s := subject(t, r, cl, "orders")
	id := register(t, cl, s, avroSchema(orderV1))
	register(t, cl, s, avroSchema(orderQtyDef))

	got, err := cl.LookupSchema(ctx, s, avroSchema(orderV1))
	if err != nil || got.ID != id || got.Version != 1 || got.Subject != s {
		t.Fatalf("LookupSchema: %+v %v", got, err)
	}
	_, err = cl.LookupSchema(ctx, s, avroSchema(orderNoNote))
	responseError(t, err, 404, sr.ErrSchemaNotFound.Code)
	_, err = cl.LookupSchema(ctx, r.Name(t, "nobody")+"-value", avroSchema(orderV1))
	responseError(t, err, 404, sr.ErrSubjectNotFound.Code)
}

// Registering a schema again returns its id and makes no version; the
// same schema under two subjects has one id.
func TestIdempotentRegistrationAndSharedIDs(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	ctx := t.Context()
	a, b := subject(t, r, cl, "orders"), subject(t, r, cl, "invoices")
	id := register(t, cl, a, avroSchema(orderV1))
	if again := register(t, cl, a, avroSchema(orderV1)); again != id {
		t.Fatalf("registered again: id %d, want %d", again, id)
	}
	spaced := strings.ReplaceAll(orderV1, ",", ",\n  ")
	if again := register(t, cl, a, avroSchema(spaced)); again != id {
		t.Fatalf("registered again with other white space: id %d, want %d", again, id)
	}
	if versions, err := cl.SubjectVersions(ctx, a); err != nil || !slices.Equal(versions, []int{1}) {
		t.Fatalf("versions after registering one schema thrice: %v %v", versions, err)
	}
	if other := register(t, cl, b, avroSchema(orderV1)); other != id {
		t.Fatalf("the same schema under a second subject: id %d, want %d", other, id)
	}
	subjects, err := cl.SubjectsByID(ctx, id)
	if want := []string{a, b}; err != nil || !slices.Equal(subjects, sorted(want)) {
		t.Fatalf("SubjectsByID: %v %v, want %v", subjects, err, sorted(want))
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestDeleteSubject(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	ctx := t.Context()
	s := subject(t, r, cl, "orders")
	id := register(t, cl, s, avroSchema(orderV1))
	register(t, cl, s, avroSchema(orderNoNote))

	_, err := cl.DeleteSubject(ctx, s, sr.HardDelete)
	responseError(t, err, 404, sr.ErrSubjectNotSoftDeleted.Code)

	deleted, err := cl.DeleteSubject(ctx, s, sr.SoftDelete)
	if err != nil || !slices.Equal(deleted, []int{1, 2}) {
		t.Fatalf("soft delete: %v %v", deleted, err)
	}
	if subjects, err := cl.Subjects(ctx); err != nil || slices.Contains(subjects, s) {
		t.Fatalf("a soft-deleted subject is listed: %v %v", subjects, err)
	}
	_, err = cl.SubjectVersions(ctx, s)
	responseError(t, err, 404, sr.ErrSubjectNotFound.Code)
	if subjects, err := cl.Subjects(sr.WithParams(ctx, sr.ShowDeleted)); err != nil || !slices.Contains(subjects, s) {
		t.Fatalf("Subjects(ShowDeleted) lacks the soft-deleted subject: %v %v", subjects, err)
	}
	if byID, err := cl.SchemaByID(ctx, id); err != nil || !jsonEqual(t, byID.Schema, orderV1) {
		t.Fatalf("a soft-deleted version's id is still readable: %+v %v", byID, err)
	}

	deleted, err = cl.DeleteSubject(ctx, s, sr.HardDelete)
	if err != nil || !slices.Equal(deleted, []int{1, 2}) {
		t.Fatalf("hard delete: %v %v", deleted, err)
	}
	if subjects, err := cl.Subjects(sr.WithParams(ctx, sr.ShowDeleted)); err != nil || slices.Contains(subjects, s) {
		t.Fatalf("a permanently deleted subject is listed: %v %v", subjects, err)
	}
	// Registered again, the schema has its id again (the stand-in's way;
	// a real registry's ids after a permanent delete are its own affair).
	if again := register(t, cl, s, avroSchema(orderV1)); again != id && !r.External() {
		t.Fatalf("registered after the delete: id %d, want %d", again, id)
	}
}

// Schema text the type's parser refuses is HTTP 422, error_code 42201,
// with the parser's message.
func TestInvalidSchemaText(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	s := subject(t, r, cl, "orders")
	for _, c := range []struct {
		schema sr.Schema
		names  string // what the parser's message names
	}{
		{avroSchema(`{"type":"record","name":"Order","fields":[{"name":"id","type":"strnig"}]}`), "strnig"},
		{avroSchema(`{"type":"record","name":"Order","fields":[`), ""},
		{sr.Schema{Type: sr.TypeProtobuf, Schema: "syntax = \"proto3\";\nmessage Order { strnig id = 1; }\n"}, "strnig"},
		{sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"object","properties":{"id":{"type":"strnig"}}}`}, ""},
	} {
		_, err := cl.RegisterSchema(t.Context(), s, c.schema, -1, -1)
		re := responseError(t, err, 422, sr.ErrInvalidSchema.Code)
		if !strings.Contains(re.Message, c.names) {
			t.Errorf("%s: the message does not name %q: %s", c.schema.Schema, c.names, re.Message)
		}
	}
	if _, err := cl.SubjectVersions(t.Context(), s); err == nil {
		t.Error("refused schemas made a version")
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	ctx := t.Context()
	s := subject(t, r, cl, "orders")

	res := cl.Compatibility(ctx, s)
	if len(res) != 1 {
		t.Fatalf("Compatibility: %+v", res)
	}
	responseError(t, res[0].Err, 404, sr.ErrSubjectLevelCompatibilityNotConfigured.Code)
	global := cl.Compatibility(ctx)
	if len(global) != 1 || global[0].Err != nil || global[0].Level.String() == "" {
		t.Fatalf("global Compatibility: %+v", global)
	}
	res = cl.Compatibility(sr.WithParams(ctx, sr.DefaultToGlobal), s)
	if len(res) != 1 || res[0].Err != nil || res[0].Level != global[0].Level {
		t.Fatalf("Compatibility(DefaultToGlobal) = %+v, want the global %s", res, global[0].Level)
	}

	for _, level := range []sr.CompatibilityLevel{sr.CompatNone, sr.CompatBackward, sr.CompatBackwardTransitive,
		sr.CompatForward, sr.CompatForwardTransitive, sr.CompatFull, sr.CompatFullTransitive} {
		setLevel(t, cl, s, level)
		res := cl.Compatibility(ctx, s)
		if len(res) != 1 || res[0].Err != nil || res[0].Level != level {
			t.Fatalf("after setting %s: %+v", level, res)
		}
	}
	var unknown struct {
		Compatibility string `json:"compatibility"`
	}
	unknown.Compatibility = "SIDEWAYS"
	err := cl.Do(ctx, "PUT", "/config/"+s, unknown, nil)
	responseError(t, err, 422, sr.ErrInvalidCompatibilityLevel.Code)
}

// The global level: BACKWARD by default, settable. Only on a stand-in: a
// shared registry's global level is not the test's to change.
func TestGlobalConfig(t *testing.T) {
	t.Parallel()
	r, cl := setup(t)
	if r.External() {
		t.Skip("sets the global level: stand-in only")
	}
	ctx := t.Context()
	if res := cl.Compatibility(ctx); len(res) != 1 || res[0].Err != nil || res[0].Level != sr.CompatBackward {
		t.Fatalf("default global level: %+v, want BACKWARD", res)
	}
	s := subject(t, r, cl, "orders")
	register(t, cl, s, avroSchema(orderV1))
	_, err := cl.RegisterSchema(ctx, s, avroSchema(orderQty), -1, -1)
	wantIncompatible(t, err, s, "qty")

	if res := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatNone}); len(res) != 1 || res[0].Err != nil || res[0].Level != sr.CompatNone {
		t.Fatalf("set the global level: %+v", res)
	}
	if res := cl.Compatibility(ctx); res[0].Err != nil || res[0].Level != sr.CompatNone {
		t.Fatalf("global level after setting NONE: %+v", res)
	}
	register(t, cl, s, avroSchema(orderQty))
}
