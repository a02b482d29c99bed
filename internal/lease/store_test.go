package lease_test

import (
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/pgexec"
)

// An acquisition takes at most the leases it asks for. The statement
// picked its free rows in a subquery of the UPDATE's FROM, which the
// planner scanned again for each cursor row: a scan after the UPDATE had
// changed the rows picked first skipped them and picked others, and a
// member asking for 2 of 3 free partitions took all 3 (found by pinning
// the simulator's model to PostgreSQL, integration/sim).
func TestAcquireTakesNoMoreThanAskedFor(t *testing.T) {
	e := newEnv(t)
	db, err := pgexec.FromDB(e.Pool)
	if err != nil {
		t.Fatal(err)
	}
	s := lease.NewPGStore(db, nil, e.Schema)
	g := lease.Group{Name: "g", Topic: "orders"}
	ctx := t.Context()
	if err := s.CreateCursors(ctx, g, 8, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2, 3} {
		got, err := s.Acquire(ctx, g, "m"+string(rune('0'+n)), 8, []int32{}, time.Minute, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != n {
			t.Errorf("asked for %d leases, took %d: %+v", n, len(got), got)
		}
	}
	if got := e.owners(t, "g", "orders"); len(got) != 6 {
		t.Errorf("after asking for 1, 2 and 3 of 8 free partitions, %d are held: %v", len(got), got)
	}
}
