package sim_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/internal/sim"
)

// The tests run on a throwaway cluster with wal_level = logical (the WAL
// model's pinning runs a relay on it).
func TestMain(m *testing.M) {
	pgtest.MainWith(m, pgcluster.Options{Settings: map[string]string{
		"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10", "wal_writer_delay": "10ms",
	}})
}

// The database model against PostgreSQL: the same scenario of the
// statements the forwarding path runs (the lease manager's and its
// leases', the counted read) runs through PostgreSQL (lease.NewPGStore,
// consumer.NewStore, on a schema of the test's own) and through the
// simulator's model, and the transcripts must be equal — what each
// statement returned and every cursor row after it, crash evidence
// included (attempts charged, suspects, deliveries, what is in flight).

const (
	pinGroup = "g"
	pinTopic = "orders"
	pinParts = 3
	pinTTL   = 30 * time.Second
)

// dbSide is one of the two databases the scenario runs on.
type dbSide struct {
	leases lease.Store
	store  consumer.Store
	begin  func(context.Context) (pgx.Tx, error)
	// expire makes a partition's lease expired, as time passing would.
	expire func(partition int)
	// forget makes a partition's writer unknown, as an upgrade from a
	// schema before writer records leaves it.
	forget func(partition int)
	cursor func(partition int) sim.CursorRow
}

func TestDatabaseModelIsPostgreSQL(t *testing.T) {
	ctx := outboxtest.Ctx(t)
	b := outboxtest.Setup(t)
	b.Register(pinTopic, pinParts)
	// A log: keys spread over the partitions, sequenced by the Sequencer.
	for i := range 12 {
		b.Publish(pinTopic, outboxtest.Keyed(fmt.Sprintf("m%d", i), fmt.Sprintf("key-%d", i%5), i, "x"))
	}
	b.SequenceAll()
	model := sim.NewDBModel(pinGroup, time.Now)
	rows, err := b.Pool.Query(ctx, `SELECT partition, uuid, coalesce(partition_key, '') FROM `+b.Schema+`.log WHERE topic = $1 ORDER BY partition, seq`, pinTopic)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p int
		var uuid, key string
		if err := rows.Scan(&p, &uuid, &key); err != nil {
			t.Fatal(err)
		}
		model.Append(pinTopic, p, uuid, key)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	db, err := pgexec.FromDB(b.Pool)
	if err != nil {
		t.Fatal(err)
	}
	tasks := consumer.NewTasks() // the Marker's goroutine runs on them
	if err := tasks.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tasks.Stop)
	pg := dbSide{
		leases: lease.NewPGStore(db, nil, b.Schema),
		store:  consumer.NewStore(b.Pool, b.Schema, pinGroup, tasks),
		begin:  func(ctx context.Context) (pgx.Tx, error) { return b.Pool.Begin(ctx) },
		expire: func(p int) {
			b.Exec(`UPDATE `+b.Schema+`.cursors SET lease_expires_at = now() - interval '1 second' WHERE group_name = $1 AND topic = $2 AND partition = $3`, pinGroup, pinTopic, p)
		},
		forget: func(p int) {
			b.Exec(`UPDATE `+b.Schema+`.cursors SET writer = NULL WHERE group_name = $1 AND topic = $2 AND partition = $3`, pinGroup, pinTopic, p)
		},
		cursor: func(p int) sim.CursorRow { return pgCursor(t, b, p) },
	}
	ms := dbSide{
		leases: model.Lease(),
		store:  model.Store(),
		begin:  model.Begin,
		expire: func(p int) { model.Expire(pinGroup, pinTopic, p) },
		forget: func(p int) { model.ForgetWriter(pinGroup, pinTopic, p) },
		cursor: func(p int) sim.CursorRow { return model.Cursor(pinGroup, pinTopic, p) },
	}
	want := dbScenario(t, pg)
	got := dbScenario(t, ms)
	if diff := compareLines(want, got); diff != "" {
		t.Fatalf("the database model differs from PostgreSQL:\n%s", diff)
	}
	t.Logf("%d lines of transcript agree", len(want))
}

// pgCursor reads a cursor row of PostgreSQL as the model shows it.
func pgCursor(t *testing.T, b *outboxtest.Bundle, p int) sim.CursorRow {
	var r sim.CursorRow
	err := b.Pool.QueryRow(outboxtest.Ctx(t), `SELECT seq, lease_token, coalesce(lease_owner, ''),
			lease_owner IS NOT NULL AND coalesce(lease_expires_at > clock_timestamp(), false),
			attempts, deliveries, unexplained, inflight_from, inflight_to, inflight_solo, suspect_from, suspect_to,
			coalesce(last_error, ''), coalesce(backoff_until > clock_timestamp(), false)
		FROM `+b.Schema+`.cursors WHERE group_name = $1 AND topic = $2 AND partition = $3`, pinGroup, pinTopic, p).
		Scan(&r.Seq, &r.Token, &r.Owner, &r.Live, &r.Attempts, &r.Deliveries, &r.Unexplained, &r.InflightFrom, &r.InflightTo,
			&r.InflightSolo, &r.SuspectFrom, &r.SuspectTo, &r.LastError, &r.BackingOff)
	if err == pgx.ErrNoRows {
		return sim.CursorRow{Missing: true}
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// pinLease is a lease as the scenario holds it: a consumer.Lease for the
// store's fenced reads.
type pinLease struct {
	partition int
	owner     string
	token     int64
}

func (l pinLease) Partition() int                               { return l.partition }
func (l pinLease) Context() context.Context                     { return context.Background() }
func (l pinLease) Owner() string                                { return l.owner }
func (l pinLease) Token() int64                                 { return l.token }
func (l pinLease) Cursor() int64                                { return 0 }
func (l pinLease) Attempts() int                                { return 0 }
func (l pinLease) LastError() string                            { return "" }
func (l pinLease) Backoff() time.Duration                       { return 0 }
func (l pinLease) Charged() int                                 { return 0 }
func (l pinLease) Suspects() (int64, int64)                     { return 0, 0 }
func (l pinLease) UnexplainedCrash() bool                       { return false }
func (l pinLease) Advance(context.Context, pgx.Tx, int64) error { return nil }
func (l pinLease) AdvanceRelaxed(context.Context, int64) error  { return nil }
func (l pinLease) RecordRetry(context.Context, pgx.Tx, error, time.Duration) error {
	return nil
}
func (l pinLease) UndoDelivery(context.Context, int64) error   { return nil }
func (l pinLease) Verify(context.Context, string, int64) error { return nil }

// dbScenario runs the scenario on d and returns its transcript.
func dbScenario(t *testing.T, d dbSide) []string {
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
	rows := func(label string) {
		for p := range pinParts {
			say("%s: cursor %d: %+v", label, p, d.cursor(p))
		}
	}
	held := map[string]map[int32]int64{} // member -> partition -> token
	acquire := func(member string, n int, exclude ...int32) {
		got, err := d.leases.Acquire(ctx, g, member, pinParts, exclude, pinTTL, n)
		check("acquire", err)
		// UPDATE ... RETURNING has no order.
		slices.SortFunc(got, func(a, b lease.Acquired) int { return cmp.Compare(a.Partition, b.Partition) })
		if held[member] == nil {
			held[member] = map[int32]int64{}
		}
		var parts []string
		for _, a := range got {
			held[member][a.Partition] = a.Token
			backoff := a.Backoff > 0 && a.Backoff <= time.Minute
			parts = append(parts, fmt.Sprintf("{p%d token %d cursor %d attempts %d charged %d error %q backoff %v suspects %d..%d unexplained %v}",
				a.Partition, a.Token, a.Cursor, a.Attempts, a.Charged, a.LastError, backoff, a.SuspectFrom, a.SuspectTo, a.Unexplained))
		}
		say("%s acquires (%d, not %v): %s", member, n, exclude, strings.Join(parts, " "))
	}
	fence := func(member string, p int32) lease.Fence {
		return lease.Fence{Group: g, Partition: int(p), Member: member, Token: held[member][p]}
	}
	read := func(member string, p int32, cursor int64, limit int, whole, solo bool) {
		entries, counted, err := d.store.Read(ctx, pinTopic, int(p), cursor, limit, pinLease{int(p), member, held[member][p]}, whole, solo)
		check("read", err)
		var seqs []string
		for _, e := range entries {
			seqs = append(seqs, fmt.Sprintf("%d:%s/%s", e.Seq, e.UUID, e.Key))
		}
		c := "nil"
		if counted != nil {
			c = fmt.Sprint(*counted)
		}
		say("%s reads p%d after %d (limit %d, whole %v, solo %v): %v counted %s", member, p, cursor, limit, whole, solo, seqs, c)
	}
	advance := func(tx pgx.Tx, relaxed bool, member string, p int32, seq int64) {
		ok, err := d.leases.Advance(ctx, tx, relaxed, fence(member, p), seq)
		check("advance", err)
		say("%s advances p%d to %d (tx %v, relaxed %v): %v", member, p, seq, tx != nil, relaxed, ok)
	}
	balance := func(member string) {
		bal, err := d.leases.Balance(ctx, g, member, pinTTL, pinParts)
		check("balance", err)
		// When the first other member expires differs by the time the
		// calls took: its bounds are the same.
		expiry := bal.OthersExpireIn > 0 && bal.OthersExpireIn <= pinTTL
		say("%s balances: others %v active %d paused %v, first expiry known %v", member, bal.Others, bal.Active, bal.Paused, expiry)
	}
	renew := func(member string) {
		var parts []int32
		var tokens []int64
		for p := range int32(pinParts) {
			if tok, ok := held[member][p]; ok {
				parts, tokens = append(parts, p), append(tokens, tok)
			}
		}
		got, err := d.leases.Renew(ctx, g, member, parts, tokens, pinTTL)
		check("renew", err)
		say("%s renews %v: %v", member, parts, got)
	}
	release := func(member string, parts ...int32) {
		var tokens []int64
		for _, p := range parts {
			tokens = append(tokens, held[member][p])
		}
		freed, err := d.leases.Release(ctx, g, member, parts, tokens)
		check("release", err)
		still, err := d.leases.StillHeld(ctx, g, member, parts, tokens)
		check("still held", err)
		say("%s releases %v: freed %v, still held %v", member, parts, freed, still)
	}
	writer := func(member string, p int32) {
		w, known, isHeld, err := d.leases.Writer(ctx, fence(member, p))
		check("writer", err)
		say("%s reads p%d's writer: %q known %v held %v", member, p, w, known, isHeld)
	}
	setWriter := func(member string, p int32, w string) {
		ok, err := d.leases.SetWriter(ctx, fence(member, p), w)
		check("set writer", err)
		say("%s records p%d's writer %q: %v", member, p, w, ok)
	}
	inspect := func(p int) {
		in, found, err := d.leases.Inspect(ctx, nil, g, p)
		check("inspect", err)
		say("inspect p%d: %+v found %v", p, in, found)
	}

	check("create cursors", d.leases.CreateCursors(ctx, g, pinParts, false))
	check("create cursors again", d.leases.CreateCursors(ctx, g, pinParts, true))
	rows("created")
	balance("member-a")
	balance("member-b")
	check("expire members", d.leases.ExpireMembers(ctx, g, time.Hour))
	// The free partitions in the order of hashtext(member:partition).
	acquire("member-a", 2)
	acquire("member-b", 3)
	acquire("member-c", 3)
	rows("acquired")

	// The writer record: read and set under the lease only.
	for p := range int32(pinParts) {
		for _, m := range []string{"member-a", "member-b", "member-c"} {
			writer(m, p)
			setWriter(m, p, "txn/"+m)
		}
		for _, m := range []string{"member-a", "member-b", "member-c"} {
			writer(m, p)
		}
	}

	// Reads counting a delivery of the head; moves of the cursor; a seq
	// not ahead changes nothing.
	for p := range int32(pinParts) {
		owner := "member-a"
		if _, ok := held[owner][p]; !ok {
			owner = "member-b"
		}
		read(owner, p, 0, 3, true, false)
		advance(nil, false, owner, p, 1)
		advance(nil, true, owner, p, 1)
		read(owner, p, 1, 1, false, true)
	}
	rows("after reads and moves")
	inspect(0)
	inspect(pinParts + 1)

	// A holder dies with its one delivery in flight (solo) on every
	// partition of member-a, and with a whole batch in flight (not solo)
	// on member-b's: the next holder is charged for the first, and gets
	// suspects for the second.
	for p := range int32(pinParts) {
		if _, ok := held["member-b"][p]; ok {
			read("member-b", p, 1, 3, true, false)
		}
		d.expire(int(p))
	}
	rows("holders dead")
	for p := range int32(pinParts) {
		writer("member-a", p)
		setWriter("member-b", p, "txn/zombie")
	}
	acquire("member-c", 3)
	rows("taken over")
	for p := range int32(pinParts) {
		writer("member-c", p) // the dead holder's record
		// The holders it took over from, with their old tokens.
		for _, m := range []string{"member-a", "member-b"} {
			setWriter(m, p, "txn/"+m+"-late")
			writer(m, p)
		}
		setWriter("member-c", p, "txn/member-c")
		writer("member-c", p)
	}
	// A row from before writer records (Migrate leaves it NULL): unknown
	// to its holder and to the others, until the holder records itself.
	d.forget(1)
	for _, m := range []string{"member-a", "member-c"} {
		writer(m, 1)
	}
	setWriter("member-a", 1, "txn/member-a-old-token")
	writer("member-c", 1)
	setWriter("member-c", 1, "txn/member-c-again")
	writer("member-c", 1)

	// A failed attempt with its backoff, kept across a takeover; an undo
	// of a delivery never handed out.
	for p := range int32(pinParts) {
		ok, err := d.leases.Retry(ctx, nil, fence("member-c", p), "boom", 20*time.Second)
		check("retry", err)
		say("member-c retries p%d: %v", p, ok)
		read("member-c", p, 1, 1, false, false)
		check("undo", d.leases.UndoDelivery(ctx, fence("member-c", p), 1))
	}
	rows("retried")
	renew("member-c")
	renew("member-a") // lost everything: nothing renewed
	for p := range int32(pinParts) {
		d.expire(int(p))
	}
	acquire("member-d", 3)
	rows("backing off, taken over")

	// A fenced write in a transaction holds the row: renewing and
	// releasing skip it until the transaction ends, acquiring skips it
	// too.
	tx, err := d.begin(ctx)
	check("begin", err)
	advance(tx, false, "member-d", 0, 2)
	renew("member-d")
	release("member-d", 0)
	in, found, err := d.leases.Inspect(ctx, tx, g, 0)
	check("inspect in tx", err)
	say("inspect p0 in the transaction: %+v found %v", in, found)
	check("commit", tx.Commit(ctx))
	rows("committed")
	release("member-d", 0, 1)
	advance(nil, false, "member-d", 0, 3) // released: lost
	setWriter("member-d", 0, "txn/member-d-late")
	writer("member-d", 0)
	acquire("member-e", 3)
	rows("released and taken")
	for p := range int32(pinParts) {
		writer("member-e", p)
		setWriter("member-d", p, "txn/member-d-late")
	}
	check("leave", d.leases.Leave(ctx, g, "member-a"))
	balance("member-b")
	return out
}
