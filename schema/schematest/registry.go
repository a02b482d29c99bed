package schematest

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// EnvRegistryURL is the environment variable that points New at a real
// Schema Registry (e.g. http://localhost:8081) instead of a stand-in.
const EnvRegistryURL = "OUTBOX_TEST_SCHEMA_REGISTRY_URL"

// Registry is the schema registry a test uses: a StandIn, or the real
// registry EnvRegistryURL names.
type Registry struct {
	// URL is the registry's base URL, for sr.URLs.
	URL string
	// StandIn is the stand-in serving URL; nil when the registry is
	// external.
	StandIn *StandIn
}

// New returns the test's registry: the real one at EnvRegistryURL when
// that variable is set, or else a stand-in started for the test and
// closed at its cleanup. A stand-in that cannot start fails the test.
// New(nil) returns nil: t is how New reports and cleans up.
func New(t testing.TB) *Registry {
	if t == nil {
		return nil
	}
	t.Helper()
	if u := strings.TrimSpace(os.Getenv(EnvRegistryURL)); u != "" {
		return &Registry{URL: strings.TrimRight(u, "/")}
	}
	return NewStandInRegistry(t)
}

// NewStandInRegistry returns a Registry served by a stand-in started for
// the test and closed at its cleanup, whatever EnvRegistryURL says: for
// the tests of an outage, which take it down (StandIn.Down) and bring it
// back (StandIn.Up). A stand-in that cannot start fails the test.
// NewStandInRegistry(nil) returns nil.
func NewStandInRegistry(t testing.TB) *Registry {
	if t == nil {
		return nil
	}
	t.Helper()
	s := NewStandIn()
	u, err := s.Start()
	if err != nil {
		t.Fatalf("schematest: start the schema registry stand-in: %v", err)
		return nil
	}
	t.Cleanup(func() { _ = s.Close() })
	return &Registry{URL: u, StandIn: s}
}

// External reports whether the registry is a real one (EnvRegistryURL),
// not a stand-in: tests that need Down and Up skip then.
func (r *Registry) External() bool {
	return r != nil && r.StandIn == nil && r.URL != ""
}

// clientTimeout bounds one request of Client's: generous, for a loaded
// machine; a stand-in that is down refuses at once.
const clientTimeout = 30 * time.Second

// Client returns a franz-go sr.Client for the registry, with an HTTP
// transport of its own whose idle connections are closed at the test's
// cleanup. It fails the test when the registry has no URL (a Registry not
// made by New). Client with a nil t returns nil.
func (r *Registry) Client(t testing.TB) *sr.Client {
	if t == nil {
		return nil
	}
	t.Helper()
	if r == nil || r.URL == "" {
		t.Fatalf("schematest: the Registry has no URL: make it with schematest.New(t)")
		return nil
	}
	transport := &http.Transport{MaxIdleConnsPerHost: 8}
	t.Cleanup(transport.CloseIdleConnections)
	cl, err := sr.NewClient(sr.URLs(r.URL), sr.HTTPClient(&http.Client{Transport: transport, Timeout: clientTimeout}))
	if err != nil {
		t.Fatalf("schematest: a schema registry client for %s: %v", r.URL, err)
		return nil
	}
	return cl
}

// Name returns base + "-" + a random suffix, so that the subjects (and
// topics) of tests never collide, on a shared real registry either: use
// it for topic names, whose subjects are "<topic>-value" and
// "<topic>-key". An empty base fails the test. Name works on a nil
// *Registry; with a nil t and an empty base it returns "".
func (r *Registry) Name(t testing.TB, base string) string {
	if base == "" {
		if t != nil {
			t.Helper()
			t.Fatalf("schematest: Name needs a base name, e.g. r.Name(t, \"orders\")")
		}
		return ""
	}
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return base + "-" + hex.EncodeToString(b[:])
}

// DownURL returns the URL of a registry that does not answer, for tests
// of an outage: the stand-in's own, taken down (it stays down: call
// StandIn.Up to bring it back), or, with a real registry (External), the
// URL of a stand-in of the test's own that went away. It fails the test
// when no stand-in can start. With a nil t it returns "".
func (r *Registry) DownURL(t testing.TB) string {
	if t == nil {
		return ""
	}
	t.Helper()
	var s *StandIn
	var u string
	if r != nil && r.StandIn != nil {
		s, u = r.StandIn, r.URL
	} else {
		s = NewStandIn()
		var err error
		if u, err = s.Start(); err != nil {
			t.Fatalf("schematest: start a stand-in to take down: %v", err)
			return ""
		}
		t.Cleanup(func() { _ = s.Close() })
	}
	if err := s.Down(); err != nil {
		t.Fatalf("schematest: take the stand-in down: %v", err)
		return ""
	}
	return u
}
