package lease_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Short timings: a lease expires 1s after its last renewal. Tests wait for
// conditions with a generous deadline, never for a fixed time to pass.
const (
	testTTL      = time.Second
	testRenew    = 250 * time.Millisecond
	testBalance  = 50 * time.Millisecond
	waitDeadline = 20 * time.Second
)

// env is one test's outbox (see internal/outboxtest). It also checks, when
// the test ends, that no goroutine started by it is left.
type env struct{ *outboxtest.Bundle }

func newEnv(t *testing.T) env { return env{outboxtest.Setup(t, outboxtest.NoLeaks())} }

func (e env) config(group, topic string, partitions int) lease.Config {
	return lease.Config{
		Schema:          e.Schema,
		Pool:            e.Pool,
		Group:           group,
		Topic:           topic,
		Partitions:      partitions,
		TTL:             testTTL,
		RenewInterval:   testRenew,
		BalanceInterval: testBalance,
	}
}

// cursorRow is one row of the cursors table.
type cursorRow struct {
	seq      int64
	owner    string // "" when free or expired
	token    int64
	paused   bool
	attempts int
	lastErr  *string
}

func (e env) cursor(t testing.TB, group, topic string, partition int) cursorRow {
	t.Helper()
	var r cursorRow
	err := e.Pool.QueryRow(context.Background(), `SELECT seq,
		CASE WHEN lease_expires_at > now() THEN coalesce(lease_owner, '') ELSE '' END,
		lease_token, paused, attempts, last_error
		FROM `+e.Schema+`.cursors WHERE group_name = $1 AND topic = $2 AND partition = $3`,
		group, topic, partition).Scan(&r.seq, &r.owner, &r.token, &r.paused, &r.attempts, &r.lastErr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// owners maps each partition of the group to its unexpired lease owner.
func (e env) owners(t testing.TB, group, topic string) map[int]string {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(), `SELECT partition, lease_owner FROM `+e.Schema+`.cursors
		WHERE group_name = $1 AND topic = $2 AND lease_owner IS NOT NULL AND lease_expires_at > now()`, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var p int
		var o string
		if err := rows.Scan(&p, &o); err != nil {
			t.Fatal(err)
		}
		out[p] = o
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// partitionsOf lists, sorted, the partitions owned by member.
func partitionsOf(owners map[int]string, member string) []int {
	var out []int
	for p, o := range owners {
		if o == member {
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out
}

// waitFor polls cond until it reports true, failing the test with cond's
// last explanation after waitDeadline.
func waitFor(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last state: %s", what, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// member is a Manager running in its own goroutine.
type member struct {
	m      *lease.Manager
	cancel context.CancelFunc
	done   chan error
}

// start runs a Manager for cfg; it is stopped when the test ends at the
// latest.
func start(t *testing.T, cfg lease.Config, onAcquire func(*lease.Lease)) *member {
	t.Helper()
	m, err := lease.NewManager(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mb := &member{m: m, cancel: cancel, done: make(chan error, 1)}
	go func() { mb.done <- m.Run(ctx, onAcquire) }()
	t.Cleanup(func() { mb.stop(t) })
	return mb
}

// stop ends Run and waits for it to return; safe to call twice.
func (mb *member) stop(t testing.TB) {
	t.Helper()
	mb.cancel()
	select {
	case err, ok := <-mb.done:
		if ok && err != nil {
			t.Errorf("Run of %s: %v", mb.m.MemberID(), err)
		}
		if ok {
			close(mb.done)
		}
	case <-time.After(waitDeadline):
		t.Fatalf("Run of %s did not return", mb.m.MemberID())
	}
}

// workers runs one worker per lease: it waits for the lease's context to
// end, then calls Done. It also checks the invariant the subscriber relies
// on: at no moment do two workers, of any members, run on one partition,
// and every acquisition of a partition has a larger token than the last.
type workers struct {
	mu         sync.Mutex
	running    map[int]string            // partition -> member whose worker runs
	lastToken  map[int]int64             // partition -> token of the last acquisition
	leases     map[string][]*lease.Lease // member -> leases acquired, in order
	violations []string
	wg         sync.WaitGroup
	zombies    bool // do not check for overlapping workers
}

func newWorkers(t *testing.T) *workers {
	w := &workers{running: map[int]string{}, lastToken: map[int]int64{}, leases: map[string][]*lease.Lease{}}
	t.Cleanup(func() {
		w.wg.Wait()
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, v := range w.violations {
			t.Error(v)
		}
	})
	return w
}

// onAcquire is the callback for the member with the given id.
func (w *workers) onAcquire(id string) func(*lease.Lease) {
	return func(l *lease.Lease) {
		p := l.Partition()
		w.mu.Lock()
		if other, ok := w.running[p]; ok && !w.zombies {
			w.violations = append(w.violations, fmt.Sprintf("partition %d acquired by %s while %s's worker still runs", p, id, other))
		}
		if l.Token() <= w.lastToken[p] {
			w.violations = append(w.violations, fmt.Sprintf("partition %d acquired with token %d after token %d", p, l.Token(), w.lastToken[p]))
		}
		w.running[p] = id
		w.lastToken[p] = l.Token()
		w.leases[id] = append(w.leases[id], l)
		w.mu.Unlock()
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			<-l.Context().Done()
			w.mu.Lock()
			if w.running[p] == id {
				delete(w.running, p)
			}
			w.mu.Unlock()
			l.Done()
		}()
	}
}

// has reports whether the callback received, for each partition in owners,
// a lease of its owner: owners read from the database may run ahead of the
// callbacks.
func (w *workers) has(owners map[int]string) bool {
	for p, o := range owners {
		if w.last(o, p) == nil {
			return false
		}
	}
	return true
}

// last returns the latest lease member acquired on partition, or nil.
func (w *workers) last(member string, partition int) *lease.Lease {
	w.mu.Lock()
	defer w.mu.Unlock()
	ls := w.leases[member]
	for i := len(ls) - 1; i >= 0; i-- {
		if ls[i].Partition() == partition {
			return ls[i]
		}
	}
	return nil
}

func intsEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
