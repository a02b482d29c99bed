package kafka_test

import (
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

// registry is a schema registry of one test.
type registry struct {
	*schematest.Registry
	url    string
	client *sr.Client
}

// newRegistry returns the test's registry: schematest's stand-in, or the
// real one of OUTBOX_TEST_SCHEMA_REGISTRY_URL.
func newRegistry(t *testing.T) registry {
	t.Helper()
	r := schematest.New(t)
	return registry{Registry: r, url: r.URL, client: r.Client(t)}
}

// id returns the id the registry gave s under subject.
func (r registry) id(t *testing.T, subject string, s sr.Schema) int {
	t.Helper()
	got, err := r.client.LookupSchema(outboxtest.Ctx(t), subject, s)
	if err != nil {
		t.Fatalf("look up %s: %v", subject, err)
	}
	return got.ID
}

// name returns a topic name of base whose subjects no other test shares.
func (r registry) name(t *testing.T, base string) string {
	t.Helper()
	return r.Name(t, base)
}
