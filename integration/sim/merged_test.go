package sim_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgcombine"
	"github.com/millrace/watermill-outbox/internal/pgexec"
)

// The statements the partitions that step together share
// (dbsql's LogReadCountingMany and CursorsAdvanceRelaxedMany, which
// internal/pgcombine sends for the counted reads and relaxed cursor moves
// that meet in a round trip) against the single statements the database
// model is pinned to (TestDatabaseModelIsPostgreSQL): the same reads and
// moves run one by one on one schema and merged on a twin schema, and
// every caller's outcome and every cursor row after them must be equal.
// So the model stands for the merged statements too.

// mergeSide is one of the twin schemas.
type mergeSide struct {
	b        *outboxtest.Bundle
	leases   lease.Store
	store    *consumer.PGStore
	combiner *pgcombine.Combiner
	tokens   map[int32]int64
}

const mergeParts = 5

func newMergeSide(t *testing.T) *mergeSide {
	ctx := outboxtest.Ctx(t)
	b := outboxtest.Setup(t)
	b.Register(pinTopic, mergeParts)
	for i := range 30 {
		b.Publish(pinTopic, outboxtest.Keyed(fmt.Sprintf("m%d", i), fmt.Sprintf("key-%d", i%7), i, "x"))
	}
	b.SequenceAll()
	tasks := consumer.NewTasks() // the Marker's goroutine runs on them
	if err := tasks.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tasks.Stop)
	store := consumer.NewStore(b.Pool, b.Schema, pinGroup, tasks)
	db, err := pgexec.FromDB(b.Pool)
	if err != nil {
		t.Fatal(err)
	}
	s := &mergeSide{b: b, leases: lease.NewPGStore(db, store.Relaxed(), b.Schema), store: store,
		combiner: store.Relaxed().(*pgcombine.Combiner), tokens: map[int32]int64{}}
	g := lease.Group{Name: pinGroup, Topic: pinTopic}
	if err := s.leases.CreateCursors(ctx, g, mergeParts, false); err != nil {
		t.Fatal(err)
	}
	got, err := s.leases.Acquire(ctx, g, "member-a", mergeParts, nil, pinTTL, mergeParts)
	if err != nil || len(got) != mergeParts {
		t.Fatalf("acquire: %v, %v", got, err)
	}
	for _, a := range got {
		s.tokens[a.Partition] = a.Token
	}
	// Partition 4's lease has expired: its fenced writes change nothing.
	b.Exec(`UPDATE `+b.Schema+`.cursors SET lease_expires_at = now() - interval '1 second' WHERE group_name = $1 AND topic = $2 AND partition = 4`, pinGroup, pinTopic)
	// Suspects (0009_crash_evidence.sql) on partitions 0 and 1: the moves
	// clear them (p0, moved past them) or start the next message with its
	// unexplained delivery (p1, moved into them).
	b.Exec(`UPDATE `+b.Schema+`.cursors SET suspect_from = 1, suspect_to = 2 WHERE group_name = $1 AND topic = $2 AND partition = 0`, pinGroup, pinTopic)
	b.Exec(`UPDATE `+b.Schema+`.cursors SET suspect_from = 1, suspect_to = 3 WHERE group_name = $1 AND topic = $2 AND partition = 1`, pinGroup, pinTopic)
	return s
}

// mergeRead is one counted read of the scenario.
type mergeRead struct {
	p            int32
	cursor       int64
	limit        int
	whole, solo  bool
	foreignToken bool // read with a token that is not the lease's
}

func (s *mergeSide) read(ctx context.Context, r mergeRead) string {
	token := s.tokens[r.p]
	if r.foreignToken {
		token += 100
	}
	entries, counted, err := s.store.Read(ctx, pinTopic, int(r.p), r.cursor, r.limit, pinLease{int(r.p), "member-a", token}, r.whole, r.solo)
	if err != nil {
		return "error " + err.Error()
	}
	var seqs []string
	for _, e := range entries {
		seqs = append(seqs, fmt.Sprintf("%d:%s/%s/%s/%v/%s", e.Seq, e.UUID, e.Key, e.Payload, e.PayloadMissing, e.Metadata))
	}
	c := "nil"
	if counted != nil {
		c = fmt.Sprint(*counted)
	}
	return fmt.Sprintf("p%d after %d: %v counted %s", r.p, r.cursor, seqs, c)
}

// mergeMove is one relaxed cursor move of the scenario.
type mergeMove struct {
	p            int32
	seq          int64
	foreignToken bool
}

func (s *mergeSide) move(ctx context.Context, m mergeMove) string {
	token := s.tokens[m.p]
	if m.foreignToken {
		token += 100
	}
	ok, err := s.leases.Advance(ctx, nil, true, lease.Fence{Group: lease.Group{Name: pinGroup, Topic: pinTopic}, Partition: int(m.p), Member: "member-a", Token: token}, m.seq)
	return fmt.Sprintf("p%d to %d: %v %v", m.p, m.seq, ok, err)
}

func (s *mergeSide) cursors(t *testing.T) string {
	var out []string
	for p := range mergeParts {
		out = append(out, fmt.Sprintf("p%d %+v", p, pgCursor(t, s.b, p)))
	}
	return strings.Join(out, "\n")
}

// together runs calls on s while its combiner's round trip is held open,
// so that they all meet in the next one, and returns their outcomes.
func (s *mergeSide) together(t *testing.T, calls []func() string) []string {
	ctx := outboxtest.Ctx(t)
	// Hold the round trip in flight: it waits for an advisory lock that
	// the test holds until every call has queued behind it.
	holder, err := s.b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_xact_lock(4242)"); err != nil {
		t.Fatal(err)
	}
	blocked := make(chan error, 1)
	go func() {
		_, err := s.combiner.Exec(ctx, "SELECT pg_advisory_xact_lock(4242)")
		blocked <- err
	}()
	outboxtest.WaitFor(t, "the round trip in flight waits for the lock", time.Minute, func() bool {
		return s.b.Int(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`) == 1
	})
	out := make([]string, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Go(func() { out[i] = call() })
	}
	outboxtest.WaitFor(t, "every call queued", time.Minute, func() bool { return s.combiner.Queued() == len(calls) })
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	return out
}

func TestMergedReadsAndMovesAreTheSingleStatements(t *testing.T) {
	ctx := outboxtest.Ctx(t)
	one, merged := newMergeSide(t), newMergeSide(t)

	reads := []mergeRead{
		{p: 0, cursor: 0, limit: 3, whole: true},
		{p: 1, cursor: 0, limit: 2, solo: true},
		{p: 2, cursor: 0, limit: 50, whole: true, solo: true},
		{p: 3, cursor: 0, limit: 2, foreignToken: true}, // not counted, still read
		{p: 4, cursor: 0, limit: 2, whole: true},        // expired lease: not counted
	}
	moves := []mergeMove{
		{p: 0, seq: 2},
		{p: 1, seq: 1},
		{p: 2, seq: 0},                     // not ahead: no move
		{p: 3, seq: 2, foreignToken: true}, // not the lease's token: no move
		{p: 4, seq: 1},                     // expired: no move
	}
	after := []mergeRead{
		{p: 0, cursor: 2, limit: 3, whole: true},
		{p: 1, cursor: 1, limit: 1},
		{p: 2, cursor: 7, limit: 3}, // a cursor the row does not have: not counted
		{p: 3, cursor: 1000, limit: 3},
	}

	var want []string
	for _, r := range reads {
		want = append(want, one.read(ctx, r))
	}
	want = append(want, one.cursors(t))
	for _, m := range moves {
		want = append(want, one.move(ctx, m))
	}
	want = append(want, one.cursors(t))
	for _, r := range after {
		want = append(want, one.read(ctx, r))
	}
	want = append(want, one.cursors(t))

	var got []string
	var calls []func() string
	for _, r := range reads {
		calls = append(calls, func() string { return merged.read(ctx, r) })
	}
	got = append(got, merged.together(t, calls)...)
	got = append(got, merged.cursors(t))
	calls = nil
	for _, m := range moves {
		calls = append(calls, func() string { return merged.move(ctx, m) })
	}
	got = append(got, merged.together(t, calls)...)
	got = append(got, merged.cursors(t))
	calls = nil
	for _, r := range after {
		calls = append(calls, func() string { return merged.read(ctx, r) })
	}
	got = append(got, merged.together(t, calls)...)
	got = append(got, merged.cursors(t))

	if diff := compareLines(want, got); diff != "" {
		t.Fatalf("merged statements differ from the single ones:\n%s", diff)
	}
	if n := merged.combiner.MergedCalls(); n != int64(len(reads)+len(moves)+len(after)) {
		t.Fatalf("%d calls went in merged statements, want %d: the scenario did not test the merge", n, len(reads)+len(moves)+len(after))
	}
	if n := one.combiner.MergedCalls(); n != 0 {
		t.Fatalf("%d calls of the one-by-one side were merged", n)
	}
	for i, line := range want {
		if strings.Contains(line, "error") {
			t.Fatalf("line %d: %s", i, line)
		}
	}
	t.Logf("%d lines agree:\n%s", len(want), strings.Join(want, "\n"))
}
