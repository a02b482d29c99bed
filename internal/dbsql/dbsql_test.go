package dbsql_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Every statement parses and plans against a migrated schema: PREPARE
// catches a typo, a missing column or a wrong table before any code path
// runs it. Each name also renders with the schema quoted, and the comments
// that document it stay out of what is sent.
func TestEveryStatementPreparesAgainstTheMigratedSchema(t *testing.T) {
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, ddl := range []string{dbsql.For(schema).CatalogCreateSchema, dbsql.For(schema).CatalogVersionTable, dbsql.For(schema).InboxCreateTable} {
		if _, err := conn.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range dbsql.Migrations {
		if _, err := conn.Exec(ctx, dbsql.Render(m.SQL, schema)); err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
	}
	q := reflect.ValueOf(*dbsql.For(schema))
	typ := q.Type()
	for i := range typ.NumField() {
		name, text := typ.Field(i).Name, q.Field(i).String()
		if text == "" {
			t.Errorf("%s: empty", name)
			continue
		}
		if strings.Contains(text, "{{") || strings.HasPrefix(text, "--") || strings.HasSuffix(text, ";") {
			t.Errorf("%s: not rendered cleanly: %q", name, text)
		}
		switch {
		case strings.HasPrefix(name, "Tx"), strings.HasPrefix(name, "CatalogCreate"), name == "CatalogVersionTable", name == "InboxCreateTable", name == "InboxAddSource",
			strings.HasSuffix(name, "Vacuum"):
			// Transaction control, DDL and VACUUM cannot be prepared;
			// they run in the tests of their callers.
			continue
		}
		if _, err := conn.Conn().Prepare(ctx, "", text); err != nil {
			t.Errorf("%s does not prepare: %v\n%s", name, err, text)
		}
	}
}

func TestRenderQuotesTheSchema(t *testing.T) {
	got := dbsql.Render("SELECT 1 FROM {{schema}}.log", `odd"name`)
	if want := `SELECT 1 FROM "odd""name".log`; got != want {
		t.Fatalf("Render = %q, want %q", got, want)
	}
	if first, again := dbsql.For("a"), dbsql.For("a"); first != again {
		t.Fatal("For does not share one Queries per schema")
	}
	if dbsql.For("a").LogRead == dbsql.For("b").LogRead {
		t.Fatal("two schemas got the same statement")
	}
}
