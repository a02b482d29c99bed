package sim

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The rows the models answer with, as pgx returns them.

// toInt reads an integer argument.
func toInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case int32:
		return int(n)
	case int64:
		return int(n)
	}
	return 0
}

// fakeRow is one row of a statement's result (or its error).
type fakeRow struct {
	vals []any
	err  error
}

func (r *fakeRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	return scanInto(r.vals, dest)
}

// scanInto assigns vals to the pointers dest, as pgx scans.
func scanInto(vals, dest []any) error {
	if len(vals) != len(dest) {
		return fmt.Errorf("sim: scan of %d values into %d destinations", len(vals), len(dest))
	}
	for i, v := range vals {
		switch d := dest[i].(type) {
		case *int64:
			*d = v.(int64)
		case *string:
			*d = v.(string)
		case **int64:
			*d = v.(*int64)
		case *[]string:
			*d = v.([]string)
		case *[]int32:
			*d = v.([]int32)
		case *[]int64:
			*d = v.([]int64)
		default:
			return fmt.Errorf("sim: scan into a %T: %w", dest[i], errNotSimulated)
		}
	}
	return nil
}

// fakeRows is a statement's rows.
type fakeRows struct {
	rows [][]any
	i    int
	err  error
}

var _ pgx.Rows = (*fakeRows)(nil)

func (r *fakeRows) Close()                                       {}
func (r *fakeRows) Err() error                                   { return r.err }
func (r *fakeRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *fakeRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *fakeRows) Next() bool {
	if r.i >= len(r.rows) {
		return false
	}
	r.i++
	return true
}
func (r *fakeRows) Scan(dest ...any) error { return scanInto(r.rows[r.i-1], dest) }
func (r *fakeRows) Values() ([]any, error) { return r.rows[r.i-1], nil }
func (r *fakeRows) RawValues() [][]byte    { return nil }
func (r *fakeRows) Conn() *pgx.Conn        { return nil }
func (r *fakeRows) TypeMap() *pgtype.Map   { return nil }
