package main

// How an application tests an HTTP handler that publishes through the
// outbox: call it, then assert what its transaction published (or did not)
// with package outboxtest. Each test gets its own outbox schema on a
// throwaway PostgreSQL (pgtemp.Schema), so tests can run in parallel.
// docs/testing.md shows this code (testingdoc_test.go checks that it does).
//
//	go test ./_examples/http-handler

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/outboxtest"
	"github.com/millrace/watermill-outbox/pgtemp"
)

func TestMain(m *testing.M) { pgtemp.Main(m) } // one throwaway PostgreSQL for the package's tests, removed after them

func testDB(t *testing.T) (*pgxpool.Pool, string) {
	pool, schema := pgtemp.Schema(t) // a schema of its own, outbox migrated, as the pool's search_path; dropped when t ends
	_, err := pool.Exec(context.Background(), `CREATE TABLE orders (id integer PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL)`)
	if err != nil { // the application's own tables go in the test's schema too
		t.Fatal(err)
	}
	return pool, schema
}

func post(t *testing.T, h http.Handler, body string) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/orders", bytes.NewBufferString(body)))
	return rec.Code
}

func TestPlacingAnOrderPublishesItsEvent(t *testing.T) {
	t.Parallel()
	pool, schema := testDB(t)
	if err := outbox.RegisterTopic(t.Context(), pool, schema, "orders", 4); err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := orderHandler{pool: pool, pub: pub}
	rec := httptest.NewRecorder()

	h.ServeHTTP(rec, httptest.NewRequest("POST", "/orders", strings.NewReader(`{"id":42,"customer":"ada","total_cents":1999}`)))

	got := outboxtest.RequirePublished(t, pool, "orders", outboxtest.InSchema(schema),
		outboxtest.Key("ada"),                                          // partition key
		outboxtest.Metadata("type", "OrderPlaced"),                     // a metadata value
		outboxtest.JSON(map[string]any{"id": 42, "total_cents": 1999}), // payload JSON containing these fields
		outboxtest.Times(1))                                            // exactly one (default: at least one)

	if rec.Code != http.StatusCreated {
		t.Fatalf("status %d", rec.Code)
	}
	if got[0].Seq != 0 {
		t.Fatalf("no sequencer runs in this test, yet the event has seq %d", got[0].Seq)
	}
}

func TestARejectedOrderPublishesNothing(t *testing.T) {
	t.Parallel()
	pool, schema := testDB(t)
	if err := outbox.RegisterTopic(t.Context(), pool, schema, "orders", 4); err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := orderHandler{pool: pool, pub: pub}

	// The handler publishes, then fails a check and rolls back: the event
	// goes with the order.
	if code := post(t, h, `{"id":7,"customer":"bob","total_cents":0}`); code != http.StatusUnprocessableEntity {
		t.Fatalf("status %d", code)
	}
	outboxtest.RequireNotPublished(t, pool, "orders", outboxtest.InSchema(schema), outboxtest.JSON(`{"id":7}`))
	// A duplicate id publishes nothing either.
	post(t, h, `{"id":8,"customer":"bob","total_cents":100}`)
	if code := post(t, h, `{"id":8,"customer":"eve","total_cents":100}`); code != http.StatusConflict {
		t.Fatalf("duplicate: status %d", code)
	}
	outboxtest.RequirePublished(t, pool, "orders", outboxtest.InSchema(schema), outboxtest.JSON(`{"id":8}`), outboxtest.Times(1))
	outboxtest.RequireNotPublished(t, pool, "orders", outboxtest.InSchema(schema), outboxtest.Key("eve"))
}
