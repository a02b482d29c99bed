package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestSingleMemberAcquiresAllAndAdvances(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	w := newWorkers(t)
	cfg := e.config("g", "orders", 4) // default MemberID
	mb := start(t, cfg, w.onAcquire("single"))
	me := mb.m.MemberID()
	if me == "" {
		t.Fatal("no default member id")
	}

	waitFor(t, "all partitions held", func() (bool, string) {
		held, owners := mb.m.Held(), e.owners(t, "g", "orders")
		ok := intsEqual(held, seq(4)) && intsEqual(partitionsOf(owners, me), seq(4)) && w.has(map[int]string{0: "single", 1: "single"})
		return ok, fmt.Sprintf("held %v, db %v", held, owners)
	})

	l0 := w.last("single", 0)
	if l0.Cursor() != 0 || l0.Attempts() != 0 || l0.Token() < 1 {
		t.Fatalf("lease 0: cursor %d, attempts %d, token %d", l0.Cursor(), l0.Attempts(), l0.Token())
	}

	// Advance through the pool.
	if err := l0.Advance(ctx, nil, 5); err != nil {
		t.Fatal(err)
	}
	if r := e.cursor(t, "g", "orders", 0); r.seq != 5 {
		t.Fatalf("cursor %d, want 5", r.seq)
	}

	// A failure is counted and stored (NUL made storable); Advance clears it.
	if err := l0.RecordFailure(ctx, nil, errors.New("boom\x00")); err != nil {
		t.Fatal(err)
	}
	if err := l0.RecordFailure(ctx, nil, errors.New("boom again")); err != nil {
		t.Fatal(err)
	}
	if r := e.cursor(t, "g", "orders", 0); r.attempts != 2 || r.lastErr == nil || *r.lastErr != "boom again" || r.seq != 5 {
		t.Fatalf("after failures: %+v", r)
	}
	if err := l0.Advance(ctx, nil, 6); err != nil {
		t.Fatal(err)
	}
	if r := e.cursor(t, "g", "orders", 0); r.attempts != 0 || r.lastErr != nil || r.seq != 6 {
		t.Fatalf("after advance: %+v", r)
	}

	// Not ahead: refused, lease kept.
	if err := l0.Advance(ctx, nil, 6); !errors.Is(err, lease.ErrSeqNotAhead) || errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("advance to the current seq: %v", err)
	}
	if l0.Context().Err() != nil {
		t.Fatal("lease context cancelled by a refused advance")
	}

	// Relaxed: moves the cursor and clears failures like Advance, and is
	// refused the same way when not ahead.
	if err := l0.RecordFailure(ctx, nil, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	if err := l0.AdvanceRelaxed(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if r := e.cursor(t, "g", "orders", 0); r.attempts != 0 || r.lastErr != nil || r.seq != 7 {
		t.Fatalf("after relaxed advance: %+v", r)
	}
	if err := l0.AdvanceRelaxed(ctx, 7); !errors.Is(err, lease.ErrSeqNotAhead) || errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("relaxed advance to the current seq: %v", err)
	}
	e.Exec(`UPDATE ` + e.Schema + `.cursors SET seq = 6 WHERE group_name = 'g' AND topic = 'orders' AND partition = 0`)

	// In the caller's transaction: the cursor moves if and only if it commits.
	for _, commit := range []bool{false, true} {
		tx, err := e.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l0.Advance(ctx, tx, 9); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		want := map[bool]int64{false: 6, true: 9}[commit]
		if r := e.cursor(t, "g", "orders", 0); r.seq != want {
			t.Fatalf("commit=%v: cursor %d, want %d", commit, r.seq, want)
		}
	}

	// A stale token: the partition's epoch moved on (as when another member
	// acquired it). The write is refused, the cursor unchanged, the lease's
	// context cancelled with ErrLeaseLost.
	l1 := w.last("single", 1)
	e.Exec(`UPDATE ` + e.Schema + `.cursors SET lease_token = lease_token + 1 WHERE group_name = 'g' AND topic = 'orders' AND partition = 1`)
	err := l1.Advance(ctx, nil, 3)
	if !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("advance with a stale token: %v", err)
	}
	if !strings.Contains(err.Error(), "token") {
		t.Errorf("error lacks detail: %v", err)
	}
	if r := e.cursor(t, "g", "orders", 1); r.seq != 0 || r.token != l1.Token()+1 {
		t.Fatalf("after stale advance: %+v", r)
	}
	if err := l1.RecordFailure(ctx, nil, errors.New("x")); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("record failure with a stale token: %v", err)
	}
	if err := l1.AdvanceRelaxed(ctx, 3); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("relaxed advance with a stale token: %v", err)
	}
	if r := e.cursor(t, "g", "orders", 1); r.seq != 0 {
		t.Fatalf("after stale relaxed advance: %+v", r)
	}
	select {
	case <-l1.Context().Done():
		if !errors.Is(context.Cause(l1.Context()), lease.ErrLeaseLost) {
			t.Fatalf("cause: %v", context.Cause(l1.Context()))
		}
	default:
		t.Fatal("lease context not cancelled")
	}

	// The row is fenced against us too until it expires; then the manager
	// acquires the partition again, with a newer token.
	waitFor(t, "partition 1 acquired again", func() (bool, string) {
		l := w.last("single", 1)
		return l != l1 && l.Token() > l1.Token()+1, fmt.Sprintf("token %d", l.Token())
	})
	if l0.Context().Err() != nil {
		t.Fatal("lease 0 lost")
	}
}

func TestRunArguments(t *testing.T) {
	e := newEnv(t)
	m, err := lease.NewManager(e.config("g", "t", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(outboxtest.Ctx(t), nil); err == nil {
		t.Fatal("Run without a callback succeeded")
	}
	mb := start(t, e.config("g", "t", 1), func(l *lease.Lease) { go func() { <-l.Context().Done(); l.Done() }() })
	waitFor(t, "lease held", func() (bool, string) { return len(mb.m.Held()) == 1, "" })
	if err := mb.m.Run(outboxtest.Ctx(t), func(*lease.Lease) {}); err == nil {
		t.Fatal("second concurrent Run succeeded")
	}
	// A missing schema is reported, not retried forever.
	cfg := e.config("g", "t", 1)
	cfg.Schema = "no_such_schema"
	m, err = lease.NewManager(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(outboxtest.Ctx(t), func(*lease.Lease) {}); err == nil {
		t.Fatal("Run on a missing schema succeeded")
	}
}

// TestRebalance: three members split 16 partitions 6/5/5, the first one
// giving back what it took while alone; when one stops,
// the other two take over its partitions (8/8) once it released them; a new
// member gets its share again (6/5/5). No partition is ever worked on by two
// members at once.
func TestRebalance(t *testing.T) {
	e := newEnv(t)
	const parts = 16
	w := newWorkers(t)

	// Sample the database all along: a fencing token names one owner, and a
	// partition's token never goes back.
	var (
		sampleMu   sync.Mutex
		sampleErrs []string
		samples    int
	)
	known := map[string]bool{"a": true, "b": true, "c": true, "d": true}
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { close(stopSampling) }); <-sampled }
	t.Cleanup(stop)
	go func() {
		defer close(sampled)
		tokenOwner := map[[2]int64]string{}
		lastToken := map[int64]int64{}
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(5 * time.Millisecond):
			}
			rows, err := e.Pool.Query(context.Background(), `SELECT partition, lease_owner, lease_token FROM `+e.Schema+`.cursors
				WHERE group_name = 'g' AND topic = 'orders' AND lease_owner IS NOT NULL AND lease_expires_at > now()`)
			if err != nil {
				continue
			}
			sampleMu.Lock()
			for rows.Next() {
				var p, tok int64
				var owner string
				if err := rows.Scan(&p, &owner, &tok); err != nil {
					sampleErrs = append(sampleErrs, err.Error())
					break
				}
				if !known[owner] {
					sampleErrs = append(sampleErrs, "unknown owner "+owner)
				}
				if o, ok := tokenOwner[[2]int64{p, tok}]; ok && o != owner {
					sampleErrs = append(sampleErrs, fmt.Sprintf("partition %d token %d held by %s and %s", p, tok, o, owner))
				}
				tokenOwner[[2]int64{p, tok}] = owner
				if tok < lastToken[p] {
					sampleErrs = append(sampleErrs, fmt.Sprintf("partition %d token went back from %d to %d", p, lastToken[p], tok))
				}
				lastToken[p] = tok
			}
			samples++
			sampleMu.Unlock()
			rows.Close()
		}
	}()

	members := map[string]*member{}
	run := func(id string) {
		cfg := e.config("g", "orders", parts)
		cfg.MemberID = id
		members[id] = start(t, cfg, w.onAcquire(id))
	}
	// split waits until the given members hold the given numbers of
	// partitions (by member id order), both in the database and by Held.
	split := func(want map[string]int) {
		t.Helper()
		waitFor(t, fmt.Sprintf("split %v", want), func() (bool, string) {
			owners := e.owners(t, "g", "orders")
			ok := len(owners) == parts
			state := fmt.Sprintf("%d held;", len(owners))
			for id, n := range want {
				db, held := partitionsOf(owners, id), members[id].m.Held()
				ok = ok && len(db) == n && intsEqual(db, held)
				state += fmt.Sprintf(" %s: db %v held %v;", id, db, held)
			}
			return ok, state
		})
	}

	// Alone, a takes everything; it gives back its surplus as b and c join.
	run("a")
	split(map[string]int{"a": parts})
	run("b")
	run("c")
	split(map[string]int{"a": 6, "b": 5, "c": 5})

	members["b"].stop(t)
	split(map[string]int{"a": 8, "c": 8})

	run("d")
	split(map[string]int{"a": 6, "c": 5, "d": 5})

	stop()
	sampleMu.Lock()
	defer sampleMu.Unlock()
	for _, s := range sampleErrs {
		t.Error(s)
	}
	if samples == 0 {
		t.Error("no samples taken")
	}
}

// TestZombie: a member stalls (no renewals, no release) while its worker
// keeps going. Another member acquires the partitions only after they
// expired; the zombie's writes are then refused and the new owner's cursor
// stays.
func TestZombie(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	w := newWorkers(t)
	w.zombies = true // the zombie's worker does run while the heir's starts
	cfgA := e.config("g", "orders", 2)
	cfgA.MemberID = "zombie"
	a := start(t, cfgA, w.onAcquire("zombie"))
	waitFor(t, "zombie holds both", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		return len(partitionsOf(o, "zombie")) == 2 && w.has(o), fmt.Sprint(o)
	})
	zl := w.last("zombie", 0)
	if err := zl.Advance(ctx, nil, 3); err != nil {
		t.Fatal(err)
	}
	lease.Freeze(a.m, true)
	// The zombie's leases expire at the latest renewal's expiry, at or after
	// what is read here; the heir may acquire them only then.
	var zombieExpiry time.Time
	if err := e.Pool.QueryRow(ctx, `SELECT max(lease_expires_at) FROM `+e.Schema+`.cursors WHERE lease_owner = 'zombie'`).Scan(&zombieExpiry); err != nil {
		t.Fatal(err)
	}

	cfgB := e.config("g", "orders", 2)
	cfgB.MemberID = "heir"
	var (
		mu         sync.Mutex
		acquiredAt []time.Time // server clock, just after each acquisition
	)
	heirAcquire := w.onAcquire("heir")
	start(t, cfgB, func(l *lease.Lease) {
		var now time.Time
		if err := e.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Error(err)
		}
		mu.Lock()
		acquiredAt = append(acquiredAt, now)
		mu.Unlock()
		heirAcquire(l)
	})
	waitFor(t, "heir holds both", func() (bool, string) {
		owners := e.owners(t, "g", "orders")
		return len(partitionsOf(owners, "heir")) == 2 && w.has(owners), fmt.Sprint(owners)
	})
	mu.Lock()
	for _, at := range acquiredAt {
		if at.Before(zombieExpiry) {
			t.Errorf("the heir acquired a lease at %v, before the zombie's expired at %v", at, zombieExpiry)
		}
	}
	mu.Unlock()
	hl := w.last("heir", 0)
	if hl.Cursor() != 3 || hl.Token() <= zl.Token() {
		t.Fatalf("heir's lease: cursor %d token %d; zombie's token %d", hl.Cursor(), hl.Token(), zl.Token())
	}
	if err := hl.Advance(ctx, nil, 10); err != nil {
		t.Fatal(err)
	}

	// The zombie wakes up with work done and tries to commit it.
	if err := zl.Advance(ctx, nil, 20); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("zombie advance: %v", err)
	}
	if err := zl.RecordFailure(ctx, nil, errors.New("x")); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("zombie record failure: %v", err)
	}
	if r := e.cursor(t, "g", "orders", 0); r.seq != 10 || r.owner != "heir" || r.attempts != 0 {
		t.Fatalf("cursor after zombie writes: %+v", r)
	}
	if !errors.Is(context.Cause(zl.Context()), lease.ErrLeaseLost) {
		t.Fatalf("zombie's lease context: %v", context.Cause(zl.Context()))
	}
	if held := a.m.Held(); len(held) != 0 {
		t.Fatalf("zombie still reports %v held", held)
	}

	// Stopping the zombie releases nothing of the heir's and removes the
	// zombie from the group.
	a.stop(t)
	if owners := e.owners(t, "g", "orders"); len(partitionsOf(owners, "heir")) != 2 {
		t.Fatalf("after the zombie stopped: %v", owners)
	}
	var n int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM `+e.Schema+`.members WHERE member_id = 'zombie'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("zombie member rows: %d, %v", n, err)
	}
	if hl.Context().Err() != nil {
		t.Fatal("heir's lease ended")
	}
}

// TestPause: a paused partition is given back by its holder and acquired by
// nobody until resumed.
func TestPause(t *testing.T) {
	e := newEnv(t)
	w := newWorkers(t)
	for _, id := range []string{"a", "b"} {
		cfg := e.config("g", "orders", 4)
		cfg.MemberID = id
		start(t, cfg, w.onAcquire(id))
	}
	waitFor(t, "2/2", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		return len(partitionsOf(o, "a")) == 2 && len(partitionsOf(o, "b")) == 2 && w.has(o), fmt.Sprint(o)
	})
	holder := e.owners(t, "g", "orders")[2]
	paused := w.last(holder, 2)

	e.Exec(`UPDATE ` + e.Schema + `.cursors SET paused = true WHERE group_name = 'g' AND topic = 'orders' AND partition = 2`)
	<-paused.Context().Done()
	waitFor(t, "paused partition released, others held", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		_, held := o[2]
		return !held && len(o) == 3, fmt.Sprint(o)
	})
	// Nobody takes it while it stays paused, over many balance rounds.
	for i := 0; i < 20; i++ {
		time.Sleep(testBalance)
		if r := e.cursor(t, "g", "orders", 2); r.owner != "" {
			t.Fatalf("paused partition acquired by %s", r.owner)
		}
	}

	e.Exec(`UPDATE ` + e.Schema + `.cursors SET paused = false WHERE group_name = 'g' AND topic = 'orders' AND partition = 2`)
	waitFor(t, "resumed partition acquired", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		return len(o) == 4 && len(partitionsOf(o, "a")) == 2, fmt.Sprint(o)
	})
	if r := e.cursor(t, "g", "orders", 2); r.token <= paused.Token() {
		t.Fatalf("token after resume %d, before %d", r.token, paused.Token())
	}
}

func TestStartPosition(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	if err := outbox.RegisterTopic(ctx, e.Pool, e.Schema, "orders", 2); err != nil {
		t.Fatal(err)
	}
	setLast := func(seq int) {
		e.Exec(`UPDATE `+e.Schema+`.partitions SET last_seq = $1 WHERE topic = 'orders' AND partition = 0`, seq)
	}
	setLast(7)

	// runOnce runs a member of group until it holds both partitions and
	// returns the cursors its leases started at.
	runOnce := func(group string, newest bool) []int64 {
		t.Helper()
		var mu sync.Mutex
		got := map[int]int64{}
		cfg := e.config(group, "orders", 2)
		cfg.StartFromNewest = newest
		mb := start(t, cfg, func(l *lease.Lease) {
			mu.Lock()
			got[l.Partition()] = l.Cursor()
			mu.Unlock()
			go func() { <-l.Context().Done(); l.Done() }()
		})
		waitFor(t, group+" holds both", func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			return len(got) == 2, ""
		})
		mb.stop(t)
		return []int64{got[0], got[1]}
	}

	if got := runOnce("replay", false); got[0] != 0 || got[1] != 0 {
		t.Fatalf("default start: %v", got)
	}
	if got := runOnce("tail", true); got[0] != 7 || got[1] != 0 {
		t.Fatalf("start from newest: %v", got)
	}
	// Existing cursors never move, whatever the option.
	setLast(9)
	if got := runOnce("tail", true); got[0] != 7 {
		t.Fatalf("existing cursor moved: %v", got)
	}
	if got := runOnce("replay", true); got[0] != 0 {
		t.Fatalf("existing cursor moved: %v", got)
	}
	if r := e.cursor(t, "tail", "orders", 0); r.owner != "" {
		t.Fatalf("stopped member left its lease: %+v", r)
	}
}

// TestWorkerDone: a worker that stops on its own gives the lease back, and
// the partition is acquired again under a new token.
func TestWorkerDone(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var tokens []int64
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // after the member stopped: registered first
	mb := start(t, e.config("g", "orders", 1), func(l *lease.Lease) {
		mu.Lock()
		tokens = append(tokens, l.Token())
		first := len(tokens) == 1
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !first {
				<-l.Context().Done()
			}
			l.Done()
		}()
	})
	waitFor(t, "second acquisition", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(tokens) == 2, fmt.Sprint(tokens)
	})
	mu.Lock()
	if tokens[1] <= tokens[0] {
		t.Errorf("tokens %v", tokens)
	}
	mu.Unlock()
	if held := mb.m.Held(); !intsEqual(held, []int{0}) {
		t.Errorf("held %v", held)
	}
}

// TestStopWaitsForWorkers: Run returns only after the workers called Done,
// and releases their leases; a worker that never calls Done delays it by at
// most about TTL, and its lease is left to expire, not released.
func TestStopWaitsForWorkers(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	leases := map[int]*lease.Lease{}
	mb := start(t, e.config("g", "orders", 2), func(l *lease.Lease) {
		mu.Lock()
		leases[l.Partition()] = l
		mu.Unlock()
	})
	waitFor(t, "both handed over", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(leases) == 2, ""
	})
	mu.Lock()
	l0, l1 := leases[0], leases[1]
	mu.Unlock()

	var finished sync.WaitGroup
	finished.Add(1)
	go func() {
		defer finished.Done()
		<-l0.Context().Done()
		l0.Done() // partition 0's worker stops; partition 1's never does
	}()
	mb.stop(t)
	finished.Wait()
	if !errors.Is(l1.Context().Err(), context.Canceled) {
		t.Fatal("lease 1's context not cancelled")
	}
	if r := e.cursor(t, "g", "orders", 0); r.owner != "" || r.token != l0.Token() {
		t.Fatalf("partition 0 not released: %+v", r)
	}
	var owner *string
	if err := e.Pool.QueryRow(context.Background(), `SELECT lease_owner FROM `+e.Schema+`.cursors WHERE partition = 1`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner == nil || *owner != mb.m.MemberID() {
		t.Fatalf("partition 1 released although its worker never stopped: %v", owner)
	}
	l1.Done() // harmless after Run returned
	l1.Done()
}

// TestRenewSkipsLockedRows: a worker's transaction that advanced the cursor
// keeps the row locked until it ends; the manager does not wait for it, and
// keeps renewing its other leases meanwhile.
func TestRenewSkipsLockedRows(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	w := newWorkers(t)
	cfg := e.config("g", "orders", 2)
	cfg.MemberID = "m"
	start(t, cfg, w.onAcquire("m"))
	waitFor(t, "both held", func() (bool, string) {
		o := e.owners(t, "g", "orders")
		return len(o) == 2 && w.has(o), fmt.Sprint(o)
	})

	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if err := w.last("m", 0).Advance(ctx, tx, 4); err != nil {
		t.Fatal(err)
	}
	expiry := func() (e1 float64) { // seconds since the epoch, 0 when released
		if err := e.Pool.QueryRow(ctx, `SELECT coalesce(extract(epoch FROM lease_expires_at), 0)::float8 FROM `+e.Schema+`.cursors WHERE partition = 1`).Scan(&e1); err != nil {
			t.Fatal(err)
		}
		return e1
	}
	// Two renewal rounds of partition 1 while partition 0's row is locked.
	first := expiry()
	waitFor(t, "partition 1 renewed", func() (bool, string) { return expiry() > first, "" })
	second := expiry()
	waitFor(t, "partition 1 renewed again", func() (bool, string) { return expiry() > second, "" })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := e.cursor(t, "g", "orders", 0); r.seq != 4 {
		t.Fatalf("cursor %d, want 4", r.seq)
	}
}

// Run has the one lifecycle (internal/startstop), with typed errors: a nil
// callback is ErrInvalidArgument; a Run whose start failed (the cursor
// rows could not be created) leaves the manager as it was, so the caller's
// join retry can Run it again; a second Run while it runs is
// ErrAlreadyRunning; a Run after Run returned is ErrClosed.
func TestRunOnceWithTypedErrors(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	doneOnStop := func(l *lease.Lease) { go func() { <-l.Context().Done(); l.Done() }() }

	cfg := e.config("g", "t", 1)
	cfg.Schema = pgtest.Schema(t) // not created yet
	m, err := lease.NewManager(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx, nil); !errors.Is(err, outbox.ErrInvalidArgument) || !strings.Contains(err.Error(), "onAcquire") {
		t.Fatalf("Run without a callback: %v, want ErrInvalidArgument naming onAcquire", err)
	}
	if err := m.Run(ctx, doneOnStop); err == nil {
		t.Fatal("Run on a missing schema succeeded")
	}
	if err := outbox.Migrate(ctx, e.Pool, cfg.Schema); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(runCtx, doneOnStop) }()
	waitFor(t, "the lease held by a Run after a failed one", func() (bool, string) { return len(m.Held()) == 1, "" })
	if err := m.Run(ctx, doneOnStop); !errors.Is(err, outbox.ErrAlreadyRunning) {
		t.Fatalf("second Run while it runs: %v, want ErrAlreadyRunning", err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := m.Run(ctx, doneOnStop); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Run after Run returned: %v, want ErrClosed", err)
	}
}
