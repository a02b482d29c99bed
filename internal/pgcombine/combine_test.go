package pgcombine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// occupy starts a statement that keeps the Combiner's round trip in flight
// for d, and returns when it is; wait returns its error.
func occupy(t *testing.T, c *Combiner, d time.Duration) (wait func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), "SELECT pg_sleep($1)", d.Seconds())
		done <- err
	}()
	waitUntil(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.busy })
	return func() error { return <-done }
}

// queued returns when n callers wait for the next round trip.
func queued(t *testing.T, c *Combiner, n int) {
	t.Helper()
	waitUntil(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.queue) == n })
}

// effectsTable creates a table in a schema of the test's own where each
// statement that takes effect leaves a row.
func effectsTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	schema := pgx.Identifier{pgtest.Schema(t)}.Sanitize()
	if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+schema+"; CREATE TABLE "+schema+".effects (caller int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	return schema + ".effects"
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// Statements issued while a round trip is in flight go together in the
// next one, each caller getting its own rows, decoded as from the pool.
func TestStatementsIssuedMeanwhileShareTheNextRoundTrip(t *testing.T) {
	c := New(pgtest.Pool(t))
	wait := occupy(t, c, 300*time.Millisecond)
	const n = 10
	type result struct {
		n        int64
		id       string
		doc      []byte
		payload  []byte
		missing  bool
		counted  *int32
		rowCount int
		err      error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rows, err := c.Query(context.Background(), `
				SELECT g, gen_random_uuid()::text, jsonb_build_object('i', $1::int8), decode(repeat('ab', $1::int4 + 1), 'hex'), $1::int8 % 2 = 0, CASE WHEN $1::int8 > 4 THEN $1::int4 END
				FROM generate_series($1::int8, $1::int8 + 2) g`, int64(i))
			if err != nil {
				results[i].err = err
				return
			}
			defer rows.Close()
			for rows.Next() {
				r := &results[i]
				var g int64
				if err := rows.Scan(&g, &r.id, &r.doc, &r.payload, &r.missing, &r.counted); err != nil {
					r.err = err
					return
				}
				if r.rowCount == 0 {
					r.n = g
				}
				r.rowCount++
			}
			results[i].err = rows.Err()
		})
	}
	queued(t, c, n)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("caller %d: %v", i, r.err)
		}
		if r.n != int64(i) || r.rowCount != 3 || len(r.id) != 36 || string(r.doc) != fmt.Sprintf(`{"i": %d}`, i) ||
			len(r.payload) != i+1 || r.missing != (i%2 == 0) || (r.counted == nil) != (i <= 4) {
			t.Fatalf("caller %d got %+v", i, r)
		}
	}
	if trips, stmts := c.Stats(); trips != 2 || stmts != n+1 {
		t.Fatalf("%d round trips for %d statements, want 2 for %d (the one in flight, then the %d that came meanwhile)", trips, stmts, n+1, n)
	}
}

// One failing statement of a round trip rolls the others back with it:
// they run again alone, so each takes effect exactly once, and the failing
// one's caller gets its own error.
func TestAFailingStatementSendsTheOthersAgainAlone(t *testing.T) {
	pool := pgtest.Pool(t)
	table := effectsTable(t, pool)
	c := New(pool)
	wait := occupy(t, c, 300*time.Millisecond)
	errs := make([]error, 3)
	affected := make([]int64, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			sql := "INSERT INTO " + table + " VALUES ($1)"
			if i == 1 {
				sql = "INSERT INTO " + table + " SELECT $1::int / 0"
			}
			affected[i], errs[i] = c.Exec(context.Background(), sql, i)
		})
		queued(t, c, i+1) // in this order
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	var pgErr *pgconn.PgError
	if !errors.As(errs[1], &pgErr) || pgErr.Code != "22012" {
		t.Fatalf("the failing statement's caller got %v, want division_by_zero", errs[1])
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil || affected[i] != 1 {
			t.Fatalf("caller %d: %d rows, %v", i, affected[i], errs[i])
		}
	}
	var rows []int32
	r, err := pool.Query(context.Background(), "SELECT caller FROM "+table+" ORDER BY caller")
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var v int32
		if err := r.Scan(&v); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, v)
	}
	if fmt.Sprint(rows) != "[0 2]" {
		t.Fatalf("rows %v, want [0 2]: each good statement once", rows)
	}
	if trips, stmts := c.Stats(); trips != 5 || stmts != 7 {
		t.Fatalf("%d round trips, %d statements; want 5 and 7 (occupy, the combined three, each again alone)", trips, stmts)
	}
}

// A caller that gives up while its statement waits for the next round trip
// leaves the queue: its statement never runs.
func TestACallerGivingUpWhileQueuedLeaves(t *testing.T) {
	pool := pgtest.Pool(t)
	table := effectsTable(t, pool)
	c := New(pool)
	wait := occupy(t, c, 300*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	gave := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "INSERT INTO "+table+" VALUES (1)")
		gave <- err
	}()
	queued(t, c, 1)
	cancel()
	if err := <-gave; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	queued(t, c, 0)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	// The Combiner is free again: a later statement goes at once.
	if n, err := c.Exec(context.Background(), "INSERT INTO "+table+" VALUES (2)"); err != nil || n != 1 {
		t.Fatal(n, err)
	}
	var got []int32
	if err := pgexec.QueryRow(context.Background(), c, "SELECT array_agg(caller) FROM "+table, nil, &got); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[2]" {
		t.Fatalf("rows %v, want [2]: the abandoned statement must not run", got)
	}
}

// Under steady concurrency every statement runs once, and round trips are
// fewer than statements (a second sender takes over while the first
// returns).
func TestManyCallersEachRunOnce(t *testing.T) {
	c := New(pgtest.Pool(t))
	const callers, each = 16, 50
	var wg sync.WaitGroup
	sums := make([]int64, callers)
	for i := range callers {
		wg.Go(func() {
			for j := range each {
				var v int64
				if err := pgexec.QueryRow(context.Background(), c, "SELECT $1::int8", []any{int64(i*1000 + j)}, &v); err != nil {
					t.Error(err)
					return
				}
				sums[i] += v
			}
		})
	}
	wg.Wait()
	for i, s := range sums {
		if want := int64(each*i*1000 + each*(each-1)/2); s != want {
			t.Fatalf("caller %d: sum %d, want %d", i, s, want)
		}
	}
	trips, stmts := c.Stats()
	if stmts != callers*each {
		t.Fatalf("%d statements counted, want %d", stmts, callers*each)
	}
	if trips >= stmts {
		t.Fatalf("%d round trips for %d statements from %d concurrent callers: nothing was combined", trips, stmts, callers)
	}
	t.Logf("%d statements from %d concurrent callers in %d round trips", stmts, callers, trips)
}

// mergeSquares registers a merge of "SELECT g, g*g FROM generate_series(1, $1) g"
// (the single statement: $1 rows): the many statement takes every call's
// $1 in one array, and returns each call's rows after its ordinal.
const (
	squares     = "SELECT g, g * g, $1::int8 FROM generate_series(1::int8, $1::int8) g"
	squaresMany = `SELECT r.i, g, g * g, r.n FROM unnest($1::int8[]) WITH ORDINALITY AS r(n, i)
		CROSS JOIN LATERAL generate_series(1::int8, r.n) g ORDER BY r.i, g`
)

func squaresMerge(key bool) Merge {
	m := Merge{Many: squaresMany, Args: func(calls [][]any) ([]any, error) {
		ns := make([]int64, len(calls))
		for i, a := range calls {
			n, ok := a[0].(int64)
			if !ok {
				return nil, fmt.Errorf("argument %v", a[0])
			}
			ns[i] = n
		}
		return []any{ns}, nil
	}}
	if key {
		m.Key = func(args []any) string { return fmt.Sprint(args[0]) }
	}
	return m
}

// squaresOf runs squares(n) through c and returns its rows as text.
func squaresOf(c *Combiner, n any) (string, error) {
	rows, err := c.Query(context.Background(), squares, n)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var g, sq, echo int64
		if err := rows.Scan(&g, &sq, &echo); err != nil {
			return "", err
		}
		out = append(out, fmt.Sprintf("%d:%d/%d", g, sq, echo))
	}
	return strings.Join(out, " "), rows.Err()
}

// Calls of a merged statement that meet in a round trip go in one
// statement, and each caller gets exactly the rows its single statement
// gives (none included); calls of one key go in statements of their own,
// and other statements of the round trip run beside the merged one.
func TestCallsOfAMergedStatementShareOneStatement(t *testing.T) {
	c := New(pgtest.Pool(t))
	c.Merge(squares, squaresMerge(true))
	wait := occupy(t, c, 300*time.Millisecond)
	ns := []int64{3, 0, 1, 3, 5} // 3 twice: the second call goes alone
	got := make([]string, len(ns)+1)
	errs := make([]error, len(ns)+1)
	var wg sync.WaitGroup
	for i, n := range ns {
		wg.Go(func() { got[i], errs[i] = squaresOf(c, n) })
		queued(t, c, i+1)
	}
	wg.Go(func() {
		var v int64
		errs[len(ns)] = pgexec.QueryRow(context.Background(), c, "SELECT $1::int8 + 1", []any{int64(41)}, &v)
		got[len(ns)] = fmt.Sprint(v)
	})
	queued(t, c, len(ns)+1)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, n := range ns {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		var want []string
		for g := range n {
			want = append(want, fmt.Sprintf("%d:%d/%d", g+1, (g+1)*(g+1), n))
		}
		if got[i] != strings.Join(want, " ") {
			t.Fatalf("call %d (n %d) got %q, want %q", i, n, got[i], strings.Join(want, " "))
		}
	}
	if errs[len(ns)] != nil || got[len(ns)] != "42" {
		t.Fatalf("the other statement got %q, %v", got[len(ns)], errs[len(ns)])
	}
	// occupy's round trip, then one with: the merged statement (4 calls),
	// the second call of key 3, the other statement.
	if trips, stmts := c.Stats(); trips != 2 || stmts != 4 {
		t.Fatalf("%d round trips, %d statements; want 2 and 4", trips, stmts)
	}
	if m := c.MergedCalls(); m != 4 {
		t.Fatalf("%d calls merged, want 4", m)
	}
}

// A merged statement that fails sends each of its calls again alone, so
// that each caller gets its own outcome; calls whose arguments the merge
// refuses go as statements of their own.
func TestAFailingMergedStatementSendsItsCallsAgainAlone(t *testing.T) {
	c := New(pgtest.Pool(t))
	c.Merge(squares, squaresMerge(false))
	wait := occupy(t, c, 300*time.Millisecond)
	args := []any{int64(2), "x", int64(1)} // "x": the merge refuses it, the single statement fails
	got := make([]string, len(args))
	errs := make([]error, len(args))
	var wg sync.WaitGroup
	for i, a := range args {
		wg.Go(func() { got[i], errs[i] = squaresOf(c, a) })
		queued(t, c, i+1)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if errs[0] != nil || got[0] != "1:1/2 2:4/2" || errs[2] != nil || got[2] != "1:1/1" {
		t.Fatalf("good calls got %q %v and %q %v", got[0], errs[0], got[2], errs[2])
	}
	if errs[1] == nil {
		t.Fatal("the call with a bad argument succeeded")
	}
	if m := c.MergedCalls(); m != 0 {
		t.Fatalf("%d calls merged, want 0: the merge refused an argument", m)
	}

	// A merged statement the server refuses: each call again alone.
	c2 := New(pgtest.Pool(t))
	bad := squaresMerge(false)
	bad.Many = "SELECT 1/0"
	c2.Merge(squares, bad)
	wait = occupy(t, c2, 300*time.Millisecond)
	for i := range 2 {
		wg.Go(func() { got[i], errs[i] = squaresOf(c2, int64(i+1)) })
		queued(t, c2, i+1)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if errs[0] != nil || got[0] != "1:1/1" || errs[1] != nil || got[1] != "1:1/2 2:4/2" {
		t.Fatalf("after a failed merged statement the calls got %q %v and %q %v", got[0], errs[0], got[1], errs[1])
	}
	if trips, stmts := c2.Stats(); trips != 4 || stmts != 4 {
		t.Fatalf("%d round trips, %d statements; want 4 and 4 (occupy, the merged one, each call alone)", trips, stmts)
	}
}
