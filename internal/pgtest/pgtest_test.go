package pgtest_test

import (
	"context"
	"testing"

	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestServerIsRealAndLoopbackOnly(t *testing.T) {
	pool := pgtest.Pool(t)
	var version, listen string
	if err := pool.QueryRow(context.Background(), "SELECT current_setting('server_version_num'), current_setting('listen_addresses')").Scan(&version, &listen); err != nil {
		t.Fatal(err)
	}
	if version < "120000" {
		t.Fatalf("server version %s, want >= 12", version)
	}
	if pgtestExternal() == false && listen != "127.0.0.1" {
		t.Fatalf("listen_addresses = %q, want 127.0.0.1", listen)
	}
	db := pgtest.DB(t)
	var one int
	if err := db.QueryRow("SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("database/sql: %v %d", err, one)
	}
	if a, b := pgtest.Schema(t), pgtest.Schema(t); a == b {
		t.Fatalf("schemas not unique: %s", a)
	}
}

func pgtestExternal() bool { return pgtest.External() }
