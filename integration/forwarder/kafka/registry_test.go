package kafka_test

import (
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// registry is a schema registry of one test.
type registry struct {
	url    string
	client *sr.Client
}

// newRegistry returns the test's registry: franz-go's srfake in process.
func newRegistry(t *testing.T) registry {
	t.Helper()
	fake := srfake.New()
	t.Cleanup(fake.Close)
	cl, err := sr.NewClient(sr.URLs(fake.URL()))
	if err != nil {
		t.Fatal(err)
	}
	return registry{url: fake.URL(), client: cl}
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

// name returns a topic name of base the registry's subjects of no other
// test share.
func (r registry) name(_ *testing.T, base string) string { return base }
