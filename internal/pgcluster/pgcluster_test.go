package pgcluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// An immediate restart keeps the data directory and the port: what was
// committed is there afterwards, a transaction open at the crash is gone,
// and the connections of before are broken.
func TestRestartImmediateKeepsCommittedDataAndPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgtest.StartCluster(ctx, pgcluster.Options{Settings: map[string]string{"synchronous_commit": "on"}})
	if errors.Is(err, pgcluster.ErrNoServerBinaries) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	port := c.Port()

	conn, err := pgx.Connect(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v text); INSERT INTO t VALUES ('committed')"); err != nil {
		t.Fatal(err)
	}
	open, err := pgx.Connect(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(context.Background())
	tx, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO t VALUES ('open')"); err != nil {
		t.Fatal(err)
	}

	if err := c.Restart(ctx, pgcluster.RestartOptions{Mode: pgcluster.Immediate, Down: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if c.Port() != port {
		t.Fatalf("port %d after the restart, %d before", c.Port(), port)
	}
	if c.Restarts() != 1 {
		t.Fatalf("Restarts() = %d, want 1", c.Restarts())
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("a transaction open at the crash committed afterwards")
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a connection of before the restart still works")
	}

	again, err := pgx.Connect(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close(context.Background())
	rows, err := again.Query(ctx, "SELECT v FROM t ORDER BY v")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "committed" {
		t.Fatalf("rows after the restart: %q, want only \"committed\"", got)
	}

	// A fast restart works too, and Restart after Stop is refused.
	if err := c.Restart(ctx, pgcluster.RestartOptions{Mode: pgcluster.Fast}); err != nil {
		t.Fatal(err)
	}
	c.Stop()
	if err := c.Restart(ctx, pgcluster.RestartOptions{}); !errors.Is(err, pgcluster.ErrStopped) {
		t.Fatalf("Restart after Stop: %v, want ErrStopped", err)
	}
}
