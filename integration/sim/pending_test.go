package sim_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/direct"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/sim"
	"github.com/millrace/watermill-outbox/partitioning"
)

// The pending model (forwarder-only topics, internal/direct) against
// PostgreSQL: the same scenario of the statements a forwarder-only topic's
// loop runs (PendingForwardRead, PendingForwarded, fenced by the leases)
// and of its publishers (a late commit: a row seen after rows of greater
// ids) runs through PostgreSQL and through the simulator's model, and the
// transcripts must be equal: every read, every set of partitions moved,
// and after each step the pending rows, the cursor rows and
// partitions.last_seq.

// pendSide is one of the two databases the scenario runs on.
type pendSide struct {
	store  direct.Store
	leases lease.Store
	// insert inserts a message in a transaction of its own, committed at
	// once or by the returned func.
	insert func(uuid, key string, now bool) (commit func())
	rows   func() []string
	last   func(p int) int64
	cursor func(p int) sim.CursorRow
	expire func(p int)
}

func TestPendingModelIsPostgreSQL(t *testing.T) {
	ctx := outboxtest.Ctx(t)
	b := outboxtest.Setup(t)
	if err := outbox.RegisterTopic(ctx, b.Pool, b.Schema, pinTopic, pinParts, outbox.ForwardOnly()); err != nil {
		t.Fatal(err)
	}
	db, err := pgexec.FromDB(b.Pool)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: b.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pg := pendSide{
		store:  direct.NewPGStore(b.Pool, b.Schema),
		leases: lease.NewPGStore(db, nil, b.Schema),
		insert: func(uuid, key string, now bool) func() {
			tx, err := b.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			m := outboxtest.Keyed(uuid, key, 1, uuid)
			m.SetContext(outbox.WithTx(ctx, tx))
			if err := pub.Publish(pinTopic, m); err != nil {
				t.Fatal(err)
			}
			commit := func() {
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if now {
				commit()
				return nil
			}
			return commit
		},
		rows: func() []string {
			rs, err := b.Pool.Query(ctx, `SELECT id, partition, uuid FROM `+b.Schema+`.pending ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			defer rs.Close()
			var out []string
			for rs.Next() {
				var id int64
				var p int
				var u string
				if err := rs.Scan(&id, &p, &u); err != nil {
					t.Fatal(err)
				}
				out = append(out, fmt.Sprintf("%d:%d:%s", id, p, u))
			}
			return out
		},
		last: func(p int) int64 {
			return b.Int(`SELECT last_seq FROM `+b.Schema+`.partitions WHERE topic = $1 AND partition = $2`, pinTopic, p)
		},
		cursor: func(p int) sim.CursorRow { return pgCursor(t, b, p) },
		expire: func(p int) {
			b.Exec(`UPDATE `+b.Schema+`.cursors SET lease_expires_at = now() - interval '1 second' WHERE group_name = $1 AND topic = $2 AND partition = $3`, pinGroup, pinTopic, p)
		},
	}
	model := sim.NewDBModel(pinGroup, time.Now)
	ms := pendSide{
		store:  model.Pending(),
		leases: model.Lease(),
		insert: func(uuid, key string, now bool) func() {
			p, _ := partitioning.Murmur2{}.Partition(key, pinParts)
			txn := model.InsertPending(p, uuid, key)
			if now {
				txn.Commit(model)
				return nil
			}
			return func() { txn.Commit(model) }
		},
		rows:   model.PendingRows,
		last:   model.LastSeq,
		cursor: func(p int) sim.CursorRow { return model.Cursor(pinGroup, pinTopic, p) },
		expire: func(p int) { model.Expire(pinGroup, pinTopic, p) },
	}
	want := pendingScenario(t, pg, func(ctx context.Context) (pgx.Tx, error) { return b.Pool.Begin(ctx) })
	got := pendingScenario(t, ms, model.Begin)
	if diff := compareLines(want, got); diff != "" {
		t.Fatalf("the pending model differs from PostgreSQL:\n%s", diff)
	}
	t.Logf("%d lines of transcript agree", len(want))
	if testing.Verbose() {
		t.Logf("transcript:\n%s", strings.Join(want, "\n"))
	}
}

// pendingScenario runs the scenario on d and returns its transcript.
func pendingScenario(t *testing.T, d pendSide, begin func(context.Context) (pgx.Tx, error)) []string {
	ctx := outboxtest.Ctx(t)
	g := lease.Group{Name: pinGroup, Topic: pinTopic}
	var out []string
	say := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	state := func(label string) {
		say("%s: pending %v", label, d.rows())
		for p := range pinParts {
			c := d.cursor(p)
			say("%s: p%d cursor %d token %d owner %q live %v error %q backing off %v, last seq %d", label, p, c.Seq, c.Token, c.Owner, c.Live, c.LastError, c.BackingOff, d.last(p))
		}
	}
	tokens := map[string]map[int]int64{}
	acquire := func(member string, n int) {
		got, err := d.leases.Acquire(ctx, g, member, pinParts, nil, pinTTL, n)
		check("acquire", err)
		slices.SortFunc(got, func(a, b lease.Acquired) int { return int(a.Partition - b.Partition) })
		if tokens[member] == nil {
			tokens[member] = map[int]int64{}
		}
		var ps []string
		for _, a := range got {
			tokens[member][int(a.Partition)] = a.Token
			ps = append(ps, fmt.Sprintf("p%d@%d cursor %d", a.Partition, a.Token, a.Cursor))
		}
		say("%s acquires: %v", member, ps)
	}
	// ids[p] are the ids of partition p read last, in order.
	ids := map[int][]int64{}
	read := func(limit int, parts ...int32) {
		rows, err := d.store.ReadPending(ctx, pinTopic, parts, limit, time.Now())
		check("read", err)
		ids = map[int][]int64{}
		var got []string
		for _, r := range rows {
			ids[r.Partition] = append(ids[r.Partition], r.ID)
			got = append(got, fmt.Sprintf("p%d:%d:%s/%s:%s", r.Partition, r.ID, r.UUID, r.Key, r.Payload))
		}
		say("read %v limit %d: %v", parts, limit, got)
	}
	forwarded := func(label string, tx pgx.Tx, member string, moves ...direct.Move) {
		moved, err := d.store.Forwarded(ctx, tx, pinGroup, pinTopic, member, moves)
		check(label, err)
		var ps []int
		for p := range moved {
			ps = append(ps, p)
		}
		slices.Sort(ps)
		var ms []string
		for _, m := range moves {
			ms = append(ms, fmt.Sprintf("p%d@%d to %d ids %v", m.Partition, m.Token, m.Last, m.IDs))
		}
		say("%s: %s forwarded %s: moved %v", label, member, strings.Join(ms, ", "), ps)
	}
	move := func(member string, p int, last int64, n int) direct.Move {
		return direct.Move{Partition: p, Token: tokens[member][p], Last: last, IDs: append([]int64(nil), ids[p][:min(n, len(ids[p]))]...)}
	}

	check("create cursors", d.leases.CreateCursors(ctx, g, pinParts, false))
	acquire("a", pinParts)
	// Messages over the partitions; m3's transaction commits late, after
	// rows with greater ids.
	var late func()
	for i := range 8 {
		uuid, key := fmt.Sprintf("m%d", i), fmt.Sprintf("key-%d", i%5)
		if i == 3 {
			late = d.insert(uuid, key, false)
			continue
		}
		d.insert(uuid, key, true)
	}
	state("published")
	read(10, 0, 1, 2)
	read(1, 0, 1, 2)
	read(2, 2, 0)
	// A statement of its own: the first two of p0 and one of p2.
	read(10, 0, 1, 2)
	forwarded("round 1", nil, "a", move("a", 0, 2, 2), move("a", 2, 1, 1))
	state("after round 1")
	late()
	read(10, 0, 1, 2)
	// In a transaction: others still see the rows until it commits.
	tx, err := begin(ctx)
	check("begin", err)
	forwarded("round 2 (open)", tx, "a", move("a", 0, 3, 1), move("a", 1, 2, 2))
	read(10, 0, 1)
	check("commit", tx.Commit(ctx))
	state("after round 2")
	// Rolled back: nothing happened.
	read(10, 0, 1, 2)
	tx, err = begin(ctx)
	check("begin", err)
	forwarded("round 3 (rolled back)", tx, "a", move("a", 1, 3, 1))
	check("rollback", tx.Rollback(ctx))
	state("after round 3")
	// Fenced: a cursor behind the move, a lease expired and taken over,
	// rows already gone.
	forwarded("behind the cursor", nil, "a", direct.Move{Partition: 0, Token: tokens["a"][0], Last: 1, IDs: nil})
	d.expire(2)
	acquire("b", 1)
	read(10, 2)
	forwarded("a's lease is gone", nil, "a", move("a", 2, 2, 1))
	forwarded("b forwards", nil, "b", move("b", 2, 2, 1))
	forwarded("b again, its rows gone", nil, "b", move("b", 2, 2, 1))
	// a's own lease expired, then taken again under a new token.
	d.insert("m8", "key-1", true)
	read(10, 0)
	d.expire(0)
	forwarded("a's lease expired", nil, "a", move("a", 0, 4, 1))
	old := tokens["a"][0]
	acquire("a", 1)
	forwarded("a's old token", nil, "a", direct.Move{Partition: 0, Token: old, Last: 4, IDs: ids[0]})
	forwarded("a's new token", nil, "a", move("a", 0, 4, 1))
	state("after the takeover")
	read(10, 0, 1, 2)
	var all []direct.Move
	for p := range pinParts {
		c := d.cursor(p)
		if tok, ok := tokens["b"][p]; ok && c.Owner == "b" {
			all = append(all, direct.Move{Partition: p, Token: tok, Last: c.Seq + int64(len(ids[p])), IDs: ids[p]})
		} else {
			all = append(all, direct.Move{Partition: p, Token: tokens["a"][p], Last: c.Seq + int64(len(ids[p])), IDs: ids[p]})
		}
	}
	forwarded("the rest, a's and b's", nil, "a", all...)
	state("the end")
	return out
}
