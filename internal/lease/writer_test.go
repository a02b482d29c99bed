package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/pgexec"
)

// The writer record of a partition (0015_cursor_writer.sql): read and set
// only under the lease that holds the partition; a row from before the
// record reads as unknown.
func TestWriterRecordIsFencedByTheLease(t *testing.T) {
	e := newEnv(t)
	db, err := pgexec.FromDB(e.Pool)
	if err != nil {
		t.Fatal(err)
	}
	s := lease.NewPGStore(db, nil, e.Schema)
	g := lease.Group{Name: "g", Topic: "orders"}
	ctx := t.Context()
	if err := s.CreateCursors(ctx, g, 2, false); err != nil {
		t.Fatal(err)
	}
	got, err := s.Acquire(ctx, g, "a", 2, []int32{1}, time.Minute, 1)
	if err != nil || len(got) != 1 || got[0].Partition != 0 {
		t.Fatalf("acquire: %+v, %v", got, err)
	}
	a := lease.Fence{Group: g, Partition: 0, Member: "a", Token: got[0].Token}

	w, known, held, err := s.Writer(ctx, a)
	if err != nil || w != "" || !known || !held {
		t.Fatalf("a new row's writer: %q known %v held %v, %v; want \"\", known, held", w, known, held, err)
	}
	if ok, err := s.SetWriter(ctx, a, "outbox/a"); !ok || err != nil {
		t.Fatalf("SetWriter by the holder: %v, %v", ok, err)
	}
	if w, known, held, err = s.Writer(ctx, a); err != nil || w != "outbox/a" || !known || !held {
		t.Fatalf("writer after SetWriter: %q known %v held %v, %v", w, known, held, err)
	}

	// The lease expires and b takes the partition: a's token no longer
	// reads or writes the record.
	if _, err := e.Pool.Exec(ctx, `UPDATE `+e.Schema+`.cursors SET lease_expires_at = now() - interval '1 second' WHERE partition = 0`); err != nil {
		t.Fatal(err)
	}
	if _, _, held, err := s.Writer(ctx, a); held || err != nil {
		t.Fatalf("Writer by an expired lease: held %v, %v; want not held", held, err)
	}
	if ok, err := s.SetWriter(ctx, a, "outbox/expired"); ok || err != nil {
		t.Fatalf("SetWriter by an expired lease: %v, %v; want nothing changed", ok, err)
	}
	got, err = s.Acquire(ctx, g, "b", 2, []int32{1}, time.Minute, 1)
	if err != nil || len(got) != 1 || got[0].Partition != 0 {
		t.Fatalf("b's acquire: %+v, %v", got, err)
	}
	b := lease.Fence{Group: g, Partition: 0, Member: "b", Token: got[0].Token}
	if _, _, held, err := s.Writer(ctx, a); held || err != nil {
		t.Fatalf("Writer by the lease b took: held %v, %v; want not held", held, err)
	}
	if ok, err := s.SetWriter(ctx, a, "outbox/zombie"); ok || err != nil {
		t.Fatalf("SetWriter by the lost lease: %v, %v; want nothing changed", ok, err)
	}
	if w, known, held, err = s.Writer(ctx, b); err != nil || w != "outbox/a" || !known || !held {
		t.Fatalf("b reads the writer: %q known %v held %v, %v; want a's record", w, known, held, err)
	}

	// A row from before the migration.
	if _, err := e.Pool.Exec(ctx, `UPDATE `+e.Schema+`.cursors SET writer = NULL WHERE partition = 0`); err != nil {
		t.Fatal(err)
	}
	if w, known, held, err = s.Writer(ctx, b); err != nil || w != "" || known || !held {
		t.Fatalf("a NULL writer: %q known %v held %v, %v; want unknown", w, known, held, err)
	}
}

// Lease.Writer and Lease.SetWriter of a lease that was lost (taken by
// another member, or expired) say so with ErrLeaseLost, and the lost
// lease's SetWriter leaves the record as it was.
func TestLeaseWriterOfALostLeaseIsLeaseLost(t *testing.T) {
	for name, lose := range map[string]string{
		"taken":   `SET lease_owner = 'b', lease_token = lease_token + 1, lease_expires_at = now() + interval '1 minute'`,
		"expired": `SET lease_expires_at = now() - interval '1 second'`,
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			m, err := lease.NewManager(e.config("g", "t", 1), nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			acquired, err := m.Step(ctx)
			if err != nil || len(acquired) != 1 {
				t.Fatalf("step: %v, %v", acquired, err)
			}
			t.Cleanup(func() { m.Stop(context.Background()) })
			l := acquired[0]
			if w, known, err := l.Writer(ctx); err != nil || w != "" || !known {
				t.Fatalf("Writer of a new row: %q %v %v; want \"\", known", w, known, err)
			}
			if err := l.SetWriter(ctx, "outbox/a"); err != nil {
				t.Fatal(err)
			}
			if w, known, err := l.Writer(ctx); err != nil || w != "outbox/a" || !known {
				t.Fatalf("Writer: %q %v %v", w, known, err)
			}
			if _, err := e.Pool.Exec(ctx, `UPDATE `+e.Schema+`.cursors `+lose); err != nil {
				t.Fatal(err)
			}
			if _, _, err := l.Writer(ctx); !errors.Is(err, lease.ErrLeaseLost) {
				t.Errorf("Writer of a lost lease: %v; want ErrLeaseLost", err)
			}
			if err := l.SetWriter(ctx, "outbox/zombie"); !errors.Is(err, lease.ErrLeaseLost) {
				t.Errorf("SetWriter of a lost lease: %v; want ErrLeaseLost", err)
			}
			var w string
			if err := e.Pool.QueryRow(ctx, `SELECT writer FROM `+e.Schema+`.cursors`).Scan(&w); err != nil || w != "outbox/a" {
				t.Errorf("the record after a lost lease's SetWriter: %q, %v; want outbox/a", w, err)
			}
		})
	}
}

// The writer read waits for no lock: a transaction holding the cursor row
// (a fenced write of the holder not yet committed) does not hold it up,
// and it reads what is committed.
func TestWriterReadDoesNotWaitForTheRowLock(t *testing.T) {
	e := newEnv(t)
	db, err := pgexec.FromDB(e.Pool)
	if err != nil {
		t.Fatal(err)
	}
	s := lease.NewPGStore(db, nil, e.Schema)
	g := lease.Group{Name: "g", Topic: "orders"}
	ctx := t.Context()
	if err := s.CreateCursors(ctx, g, 1, false); err != nil {
		t.Fatal(err)
	}
	got, err := s.Acquire(ctx, g, "a", 1, nil, time.Minute, 1)
	if err != nil || len(got) != 1 {
		t.Fatalf("acquire: %+v, %v", got, err)
	}
	a := lease.Fence{Group: g, Partition: 0, Member: "a", Token: got[0].Token}
	if ok, err := s.SetWriter(ctx, a, "outbox/a"); !ok || err != nil {
		t.Fatalf("SetWriter: %v, %v", ok, err)
	}
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if ok, err := s.Advance(ctx, tx, false, a, 5); !ok || err != nil {
		t.Fatalf("advance in the transaction: %v, %v", ok, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE `+e.Schema+`.cursors SET writer = 'uncommitted'`); err != nil {
		t.Fatal(err)
	}
	if w, known, held, err := s.Writer(ctx, a); err != nil || w != "outbox/a" || !known || !held {
		t.Fatalf("Writer while the row is locked: %q known %v held %v, %v; want the committed outbox/a", w, known, held, err)
	}
}
