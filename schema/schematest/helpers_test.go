package schematest_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/millrace/watermill-outbox/schema/schematest"
)

// setup is the test's registry (a stand-in, or OUTBOX_TEST_SCHEMA_REGISTRY_URL's)
// and a client of it.
func setup(t *testing.T) (*schematest.Registry, *sr.Client) {
	t.Helper()
	r := schematest.New(t)
	return r, r.Client(t)
}

// subject is a subject of the test's own ("<base>-<suffix>-value"),
// deleted (soft, then permanently) at cleanup so that a shared registry
// keeps nothing of the test.
func subject(t *testing.T, r *schematest.Registry, cl *sr.Client, base string) string {
	t.Helper()
	s := r.Name(t, base) + "-value"
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = cl.DeleteSubject(ctx, s, sr.SoftDelete)
		_, _ = cl.DeleteSubject(ctx, s, sr.HardDelete)
	})
	return s
}

// setLevel sets the compatibility level of subject s (never the global
// one: a shared registry's global level is not the test's to change).
func setLevel(t *testing.T, cl *sr.Client, s string, level sr.CompatibilityLevel) {
	t.Helper()
	res := cl.SetCompatibility(t.Context(), sr.SetCompatibility{Level: level}, s)
	if len(res) != 1 || res[0].Err != nil {
		t.Fatalf("set the level of %s to %s: %+v", s, level, res)
	}
}

// responseError is err's *sr.ResponseError, or fails the test.
func responseError(t *testing.T, err error, status, code int) *sr.ResponseError {
	t.Helper()
	var re *sr.ResponseError
	if !errors.As(err, &re) {
		t.Fatalf("want a registry error %d/%d, got %v", status, code, err)
	}
	if re.StatusCode != status || re.ErrorCode != code {
		t.Fatalf("want HTTP %d error_code %d, got HTTP %d error_code %d: %s", status, code, re.StatusCode, re.ErrorCode, re.Message)
	}
	return re
}

// wantIncompatible checks that a registration failed as an incompatible
// schema (HTTP 409, error_code 409) for subject s, its message naming
// each of names (field or message names, which every registry names).
func wantIncompatible(t *testing.T, err error, s string, names ...string) *sr.ResponseError {
	t.Helper()
	re := responseError(t, err, 409, 409)
	if !strings.Contains(re.Message, `incompatible with an earlier schema for subject "`+s+`"`) {
		t.Errorf("message does not say which subject: %s", re.Message)
	}
	for _, n := range names {
		if !strings.Contains(re.Message, n) {
			t.Errorf("message does not name %q: %s", n, re.Message)
		}
	}
	return re
}

func avroSchema(text string) sr.Schema { return sr.Schema{Schema: text, Type: sr.TypeAvro} }

func register(t *testing.T, cl *sr.Client, s string, sch sr.Schema) int {
	t.Helper()
	id, err := cl.RegisterSchema(t.Context(), s, sch, -1, -1)
	if err != nil {
		t.Fatalf("register under %s: %v", s, err)
	}
	return id
}

// Avro schemas of an Order. Removing note (v1 -> noNote) is backward but
// not forward compatible: the new reader ignores note, the old one finds
// it missing without a default. Adding qty without a default (v1 -> qty)
// is forward but not backward compatible. Adding it with a default is
// both.
const (
	orderV1     = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"note","type":"string"}]}`
	orderNoNote = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"}]}`
	orderQty    = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"note","type":"string"},{"name":"qty","type":"int"}]}`
	orderQtyDef = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"note","type":"string"},{"name":"qty","type":"int","default":0}]}`
)
