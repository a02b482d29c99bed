package pgtemp_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/pgtemp"
)

// A demo's database: a throwaway server of its own, from the PostgreSQL
// installed or fetched once, with the outbox migrated.
func ExampleStart() {
	ctx := context.Background()
	srv, err := pgtemp.Start(ctx, pgtemp.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop() // removes the server and its data

	pool, err := pgxpool.New(ctx, srv.URL(""))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool, outbox.DefaultSchema); err != nil {
		log.Fatal(err)
	}
	fmt.Println("outbox migrated on a throwaway PostgreSQL")
	// Output: outbox migrated on a throwaway PostgreSQL
}

// An application's tests: TestMain runs them with one throwaway server,
// and each test takes a schema of its own (docs/testing.md shows more).
func ExampleSchema() {
	// In a _test.go file:
	//
	//	func TestMain(m *testing.M) { pgtemp.Main(m) }
	//
	//	func TestPlacingAnOrder(t *testing.T) {
	//		t.Parallel()
	//		pool, schema := pgtemp.Schema(t) // outbox migrated; the pool's search_path
	//		pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: pool}, nil)
	//		...
	//		outboxtest.RequirePublished(t, pool, "orders", outboxtest.InSchema(schema), outboxtest.Key("ada"))
	//	}
}
