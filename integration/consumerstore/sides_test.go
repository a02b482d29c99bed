package consumerstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/consumer/consumerfake"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// The two databases a scenario runs on: PostgreSQL (the product's
// statements) and the unit tests' fake. Each is one partition of one
// topic, read by consumer group "g", whose lease member "me" holds.

const (
	group  = "g"
	topic  = "orders"
	member = "me"
)

// side is one of the two databases, as a scenario drives it.
type side struct {
	store consumer.Store
	lease consumer.Lease
	// lose makes another member take the partition's lease over (a new
	// owner and token on the cursor row, nothing else changed).
	lose func()
	// expire makes the lease expire, nobody taking it over.
	expire func()
	// reacquire ends the lease (its holder died, nothing undone) and
	// acquires the partition again: the acquisition settles what the
	// cursor row has in flight (crash evidence).
	reacquire func() consumer.Lease
	// write is the statement a handler runs in its transaction to write
	// label; "FAIL" is a write that fails (a unique violation) and aborts
	// the transaction.
	write func(label string) string
	// cursor, held and effects are the rows the side keeps: the cursor
	// row, the held rows in seq order, the handlers' committed writes in
	// commit order.
	cursor  func() cursorView
	held    func() []heldView
	effects func() []string
}

// cursorView is what both sides keep of the cursor row.
type cursorView struct {
	Seq, Attempts, Deliveries int64
	InflightFrom, InflightTo  int64
	InflightSolo              bool
	Unexplained               int64
	SuspectFrom, SuspectTo    int64
	LastError                 string
	BackingOff                bool
	Adaptive                  string
	Full                      bool // isolation_full is set
}

// heldView is what both sides keep of a held row. Retry is "none", "due"
// (at or before now) or "later".
type heldView struct {
	Seq          int64
	Keyless      bool
	Key          string
	Attempts     int
	Deliveries   int
	LastError    string
	FirstFailure bool
	Retry        string
	Requested    string
	Suspect      bool
	Inflight     bool
	Solo         bool
}

// retryView classifies a retry time.
func retryView(at *time.Time, now time.Time) string {
	switch {
	case at == nil || at.IsZero():
		return "none"
	case at.After(now):
		return "later"
	default:
		return "due"
	}
}

// pgSide is PostgreSQL: a schema of the test's own with the topic's log
// (msgs), consumer.NewStore for the group, and a lease from
// internal/lease's manager.
func pgSide(t *testing.T, msgs []msg) (*side, []consumer.Entry) {
	ctx := outboxtest.Ctx(t)
	b := outboxtest.Setup(t)
	b.Register(topic, 1)
	for _, m := range msgs {
		b.Publish(topic, m.message())
	}
	b.SequenceAll()
	b.Exec(`CREATE TABLE ` + b.Schema + `.fx (n serial, label text PRIMARY KEY)`)
	b.Exec(`INSERT INTO ` + b.Schema + `.fx (label) VALUES ('FAIL')`)

	tasks := consumer.NewTasks() // the Marker's goroutine runs on them
	if err := tasks.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tasks.Stop)
	store := consumer.NewStore(b.Pool, b.Schema, group, tasks)

	acquire := func() consumer.Lease {
		m, err := lease.NewManager(lease.Config{Schema: b.Schema, Pool: b.Pool, Group: group, Topic: topic, Partitions: 1,
			MemberID: member, TTL: time.Hour}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := m.Step(ctx)
		if err != nil || len(got) != 1 {
			t.Fatalf("acquire: %v leases, %v", len(got), err)
		}
		t.Cleanup(func() { got[0].Done(); m.Stop(context.Background()) })
		return consumer.PGLease{Lease: got[0]}
	}
	s := &side{store: store, lease: acquire()}
	where := ` WHERE group_name = '` + group + `' AND topic = '` + topic + `' AND partition = 0`
	s.lose = func() {
		b.Exec(`UPDATE ` + b.Schema + `.cursors SET lease_owner = 'thief', lease_token = lease_token + 1` + where)
	}
	s.expire = func() {
		b.Exec(`UPDATE ` + b.Schema + `.cursors SET lease_expires_at = now() - interval '1 second'` + where)
	}
	s.reacquire = func() consumer.Lease {
		b.Exec(`UPDATE ` + b.Schema + `.cursors SET lease_owner = NULL, lease_expires_at = NULL` + where)
		return acquire()
	}
	s.write = func(label string) string {
		return `INSERT INTO ` + b.Schema + `.fx (label) VALUES ('` + label + `')`
	}
	s.cursor = func() cursorView {
		var c cursorView
		if err := b.Pool.QueryRow(ctx, `SELECT seq, attempts, deliveries, inflight_from, inflight_to, inflight_solo,
				unexplained, suspect_from, suspect_to, coalesce(last_error, ''), coalesce(backoff_until > clock_timestamp(), false), adaptive_state, isolation_full IS NOT NULL
			FROM `+b.Schema+`.cursors`+where).
			Scan(&c.Seq, &c.Attempts, &c.Deliveries, &c.InflightFrom, &c.InflightTo, &c.InflightSolo,
				&c.Unexplained, &c.SuspectFrom, &c.SuspectTo, &c.LastError, &c.BackingOff, &c.Adaptive, &c.Full); err != nil {
			t.Fatal(err)
		}
		return c
	}
	s.held = func() []heldView {
		rows, err := b.Pool.Query(ctx, `SELECT seq, partition_key IS NULL, coalesce(partition_key, ''), attempts, deliveries,
				coalesce(last_error, ''), first_failure_at IS NOT NULL, retry_at, clock_timestamp(), coalesce(requested, ''), unexplained > 0,
				inflight, inflight_solo
			FROM `+b.Schema+`.held`+where+` ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []heldView
		for rows.Next() {
			var h heldView
			var at *time.Time
			var now time.Time
			if err := rows.Scan(&h.Seq, &h.Keyless, &h.Key, &h.Attempts, &h.Deliveries, &h.LastError, &h.FirstFailure, &at, &now,
				&h.Requested, &h.Suspect, &h.Inflight, &h.Solo); err != nil {
				t.Fatal(err)
			}
			h.Retry = retryView(at, now)
			out = append(out, h)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	s.effects = func() []string {
		var out []string
		rows, err := b.Pool.Query(ctx, `SELECT label FROM `+b.Schema+`.fx WHERE label <> 'FAIL' ORDER BY n`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var l string
			if err := rows.Scan(&l); err != nil {
				t.Fatal(err)
			}
			out = append(out, l)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// The log as PostgreSQL sequenced it: the fake's log is the same.
	log, _, err := store.Read(ctx, topic, 0, 0, len(msgs)+1, nil, false, false)
	if err != nil || len(log) != len(msgs) {
		t.Fatalf("the log: %d entries, %v", len(log), err)
	}
	return s, log
}

// fakeSide is the fake, with log as its log.
func fakeSide(log []consumer.Entry) *side {
	f := consumerfake.New()
	for _, e := range log {
		f.Append(e)
	}
	l := consumerfake.NewLease(f)
	s := &side{store: f, lease: l}
	s.lose = func() { s.lease.(*consumerfake.Lease).Lose() }
	s.expire = func() { s.lease.(*consumerfake.Lease).Expire() }
	s.reacquire = func() consumer.Lease { return consumerfake.NewLease(f) }
	s.write = func(label string) string {
		if label == "FAIL" {
			return "FAIL"
		}
		return "effect " + label
	}
	s.cursor = func() cursorView {
		c := f.State()
		adaptive := c.Adaptive
		if adaptive == "" {
			adaptive = "normal" // a new cursor row's adaptive_state
		}
		return cursorView{Seq: c.Seq, Attempts: c.Attempts, Deliveries: c.Deliveries, InflightFrom: c.InflightFrom, InflightTo: c.InflightTo,
			InflightSolo: c.InflightSolo, Unexplained: c.Unexplained, SuspectFrom: c.SuspectFrom, SuspectTo: c.SuspectTo, LastError: c.LastError, BackingOff: c.BackoffUntil.After(time.Now()), Adaptive: adaptive, Full: c.Full}
	}
	s.held = func() []heldView {
		f.Mu.Lock()
		defer f.Mu.Unlock()
		now := time.Now()
		var out []heldView
		for seq := int64(1); seq <= int64(len(f.Log)); seq++ {
			h := f.Held[seq]
			if h == nil {
				continue
			}
			out = append(out, heldView{Seq: h.Seq, Keyless: h.Keyless, Key: h.Key, Attempts: h.Attempts, Deliveries: h.Deliveries,
				LastError: h.Err, FirstFailure: !h.FirstFailure.IsZero(), Retry: retryView(&h.RetryAt, now), Requested: h.Requested,
				Suspect: h.Unexplained > 0, Inflight: h.Inflight, Solo: h.Solo})
		}
		return out
	}
	s.effects = func() []string {
		var out []string
		for _, e := range f.CommittedEffects() {
			out = append(out, strings.TrimPrefix(e, "effect "))
		}
		return out
	}
	return s
}

// errClass is the class of an error the core tells apart (errors.Is, the
// SQLSTATE), or "error" for any other.
func errClass(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, lease.ErrLeaseLost):
		return "lease lost"
	case errors.Is(err, lease.ErrSeqNotAhead):
		return "seq not ahead"
	case errors.Is(err, pgx.ErrTxClosed):
		return "tx closed"
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return "commit rolled back"
	case errors.As(err, &pgErr):
		return "sqlstate " + pgErr.Code
	}
	return "error"
}

// entries formats what a read returned.
func entries(es []consumer.Entry) string {
	var b strings.Builder
	b.WriteString("[")
	for i, e := range es {
		if i > 0 {
			b.WriteString(" ")
		}
		meta := make([]string, 0, len(e.Metadata))
		for k, v := range e.Metadata {
			meta = append(meta, k+"="+v)
		}
		slices.Sort(meta)
		fmt.Fprintf(&b, "%d:%s/%q/%s/%s", e.Seq, e.UUID, e.Key, e.Payload, strings.Join(meta, ","))
		if e.PayloadMissing {
			b.WriteString("/missing")
		}
	}
	b.WriteString("]")
	return b.String()
}
