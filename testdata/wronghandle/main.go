// Command wronghandle must not compile: Migrate is given a handle that is
// not an outbox.DB. TestAWrongHandleIsACompileError builds it.
package main

import (
	"context"

	outbox "github.com/millrace/watermill-outbox"
)

func main() {
	var notADatabase = "postgres://localhost/app"
	_ = outbox.Migrate(context.Background(), notADatabase, outbox.DefaultSchema)
}
