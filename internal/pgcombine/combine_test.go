package pgcombine

import (
	"context"
	"errors"
	"fmt"
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
