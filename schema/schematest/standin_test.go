package schematest_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

// standIn is a stand-in of the test's own and a client of it, for the
// tests of what only a stand-in does (Down, Up, Requests).
func standIn(t *testing.T) (*schematest.StandIn, string, *sr.Client) {
	t.Helper()
	s := schematest.NewStandIn()
	u, err := s.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	r := &schematest.Registry{URL: u, StandIn: s}
	return s, u, r.Client(t)
}

// Down makes the registry go away (the client gets a refused connection,
// not an answer); Up brings it back on the same URL with the same state.
func TestDownAndUp(t *testing.T) {
	t.Parallel()
	s, u, cl := standIn(t)
	ctx := t.Context()
	if !strings.HasPrefix(u, "http://127.0.0.1:") {
		t.Fatalf("the stand-in listens at %s, not on the loopback address", u)
	}
	id := register(t, cl, "orders-value", avroSchema(orderV1))

	if err := s.Down(); err != nil {
		t.Fatal(err)
	}
	if err := s.Down(); err != nil {
		t.Fatalf("Down when down: %v", err)
	}
	_, err := cl.SchemaByID(ctx, id)
	var re *sr.ResponseError
	if err == nil || errors.As(err, &re) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a client of a stand-in that is down: %v, want a refused connection", err)
	}

	if err := s.Up(); err != nil {
		t.Fatal(err)
	}
	if err := s.Up(); err != nil {
		t.Fatalf("Up when up: %v", err)
	}
	got, err := cl.SchemaByID(ctx, id)
	if err != nil || !jsonEqual(t, got.Schema, orderV1) {
		t.Fatalf("after Up, on the same URL: %+v %v", got, err)
	}
	if again := register(t, cl, "orders-value", avroSchema(orderV1)); again != id {
		t.Fatalf("after Up the state is gone: id %d, want %d", again, id)
	}
}

// Requests counts each request served, which is what a test compares to
// prove that code does not ask the registry once per message.
func TestRequests(t *testing.T) {
	t.Parallel()
	s, _, cl := standIn(t)
	ctx := t.Context()
	if n := s.Requests(); n != 0 {
		t.Fatalf("a new stand-in served %d requests", n)
	}
	id := register(t, cl, "orders-value", avroSchema(orderV1))
	for range 4 {
		if _, err := cl.SchemaByID(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = cl.SchemaByID(ctx, id+100) // an error answer is a request served too
	if n := s.Requests(); n != 6 {
		t.Fatalf("Requests = %d after 6 requests", n)
	}
}

// Handler serves the same REST surface on a server of the application's
// own, counted in Requests.
func TestHandler(t *testing.T) {
	t.Parallel()
	s := schematest.NewStandIn()
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	cl := (&schematest.Registry{URL: srv.URL, StandIn: s}).Client(t)
	id := register(t, cl, "orders-value", avroSchema(orderV1))
	if got, err := cl.SchemaByID(t.Context(), id); err != nil || !jsonEqual(t, got.Schema, orderV1) {
		t.Fatalf("SchemaByID through Handler: %+v %v", got, err)
	}
	if n := s.Requests(); n != 2 {
		t.Fatalf("Requests = %d after 2 requests through Handler", n)
	}
	err := cl.Do(t.Context(), http.MethodGet, "/no/such/endpoint", nil, nil)
	responseError(t, err, 404, 404)
}

// The lifecycle's misuses are typed errors that say what to do; a nil or
// zero StandIn does not panic.
func TestLifecycleErrors(t *testing.T) {
	t.Parallel()
	var nilS *schematest.StandIn
	for name, err := range map[string]error{"Start": func() error { _, err := nilS.Start(); return err }(), "Down": nilS.Down(), "Up": nilS.Up(), "Close": nilS.Close()} {
		if !errors.Is(err, schematest.ErrNilStandIn) || !errors.Is(err, outbox.ErrInvalidArgument) {
			t.Errorf("nil StandIn: %s: %v", name, err)
		}
	}
	if nilS.Requests() != 0 {
		t.Error("a nil StandIn served requests")
	}
	rec := httptest.NewRecorder()
	nilS.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/subjects", nil))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"error_code":50001`) {
		t.Errorf("nil StandIn's handler: %d %s", rec.Code, rec.Body)
	}

	s := new(schematest.StandIn) // the zero value works
	if err := s.Down(); !errors.Is(err, schematest.ErrNotStarted) {
		t.Errorf("Down before Start: %v", err)
	}
	if err := s.Up(); !errors.Is(err, schematest.ErrNotStarted) {
		t.Errorf("Up before Start: %v", err)
	}
	if _, err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(); !errors.Is(err, schematest.ErrAlreadyStarted) || !errors.Is(err, outbox.ErrAlreadyRunning) {
		t.Errorf("Start twice: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close twice: %v", err)
	}
	for name, err := range map[string]error{"Start": func() error { _, err := s.Start(); return err }(), "Down": s.Down(), "Up": s.Up()} {
		if !errors.Is(err, schematest.ErrClosed) || !errors.Is(err, outbox.ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	if err := schematest.NewStandIn().Close(); err != nil {
		t.Errorf("Close of a stand-in never started: %v", err)
	}
}

// DownURL is a URL that refuses connections: the test registry's own
// stand-in taken down, or, for an external registry, one of its own.
func TestDownURLRefuses(t *testing.T) {
	t.Parallel()
	s, u, _ := standIn(t)
	for name, r := range map[string]*schematest.Registry{
		"a stand-in":           {URL: u, StandIn: s},
		"an external registry": {URL: "http://registry.invalid:8081"},
	} {
		down := r.DownURL(t)
		if r.StandIn != nil && down != r.URL {
			t.Errorf("%s: DownURL %s, want its own URL %s", name, down, r.URL)
		}
		cl, err := sr.NewClient(sr.URLs(down))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Subjects(t.Context()); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: a client of DownURL: %v, want a refused connection", name, err)
		}
	}
}
