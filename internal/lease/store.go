package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
)

// Store is the database a Manager and its Leases work on: the statements
// on the group's cursor rows and member rows (cursors.sql, members.sql).
// NewPGStore is PostgreSQL's, the one the product runs on; the
// deterministic simulator (internal/sim) has a model of it, which the
// tests of integration/sim pin to this one by running the same scenarios
// through both. A Store keeps no state of its own between calls.
//
// The fenced writes take tx, the caller's open transaction (the write
// then commits with it, and keeps the row locked until it ends), or nil
// for a statement of its own.
type Store interface {
	// CreateCursors creates the group's cursor rows of the topic's
	// partitions 0..partitions-1 that are missing, at 0 or, with
	// fromNewest, at the partition's last seq.
	CreateCursors(ctx context.Context, g Group, partitions int, fromNewest bool) error
	// ExpireMembers forgets the members of the group not heard from for
	// longer than deadFor.
	ExpireMembers(ctx context.Context, g Group, deadFor time.Duration) error
	// Balance records member's heartbeat (live for ttl) and returns what
	// it needs to rebalance.
	Balance(ctx context.Context, g Group, member string, ttl time.Duration, partitions int) (Balance, error)
	// Acquire takes up to n free or expired leases of partitions
	// 0..partitions-1 but those excluded, for ttl, never a live one nor a
	// row locked by a transaction, settling what a dead holder left in
	// flight (crash evidence).
	Acquire(ctx context.Context, g Group, member string, partitions int, exclude []int32, ttl time.Duration, n int) ([]Acquired, error)
	// Renew extends by ttl the unexpired leases of member among parts and
	// tokens: renewed[p] is true when renewed, false when its row was
	// locked by a transaction (still held); a partition missing from the
	// result is lost.
	Renew(ctx context.Context, g Group, member string, parts []int32, tokens []int64, ttl time.Duration) (renewed map[int32]bool, err error)
	// Release gives back member's leases among parts and tokens whose rows
	// no transaction locks, and returns their partitions.
	Release(ctx context.Context, g Group, member string, parts []int32, tokens []int64) ([]int32, error)
	// StillHeld returns the partitions among parts and tokens whose lease
	// member still holds unexpired.
	StillHeld(ctx context.Context, g Group, member string, parts []int32, tokens []int64) ([]int32, error)
	// Leave removes member from the group.
	Leave(ctx context.Context, g Group, member string) error

	// Advance moves the cursor to seq when f holds (the lease is f's and
	// unexpired) and seq is ahead of it; ok is false when nothing
	// changed. relaxed commits it (without tx) without waiting for the
	// WAL flush.
	Advance(ctx context.Context, tx pgx.Tx, relaxed bool, f Fence, seq int64) (ok bool, err error)
	// Retry records a failed attempt of the head and when its retry is
	// due, when f holds; ok is false when nothing changed.
	Retry(ctx context.Context, tx pgx.Tx, f Fence, text string, retryIn time.Duration) (ok bool, err error)
	// UndoDelivery takes back the delivery in flight at cursor, when f
	// holds.
	UndoDelivery(ctx context.Context, f Fence, cursor int64) error
	// Inspect reads the cursor row of partition p: found is false when
	// the row is gone.
	Inspect(ctx context.Context, tx pgx.Tx, g Group, p int) (in Inspection, found bool, err error)

	// Writer reads who last wrote f's partition into the target: the
	// transactional id a forwarder recorded with SetWriter ("" nobody
	// yet; known false: the row predates writer records, cursors.writer
	// NULL), when f holds (held false otherwise, writer "").
	Writer(ctx context.Context, f Fence) (writer string, known, held bool, err error)
	// SetWriter records writer as the partition's writer, when f holds;
	// ok is false when nothing changed.
	SetWriter(ctx context.Context, f Fence, writer string) (ok bool, err error)
}

// Group names the cursor rows of one consumer group on one topic.
type Group struct{ Name, Topic string }

// Fence is what a fenced write of a lease is conditioned on.
type Fence struct {
	Group
	Partition int
	Member    string
	Token     int64
}

// Balance is what a heartbeat returns: the other live members, the
// partitions that are not paused, the paused ones this member holds, and
// how soon the first of the others expires unless it heartbeats (0: no
// other live member).
type Balance struct {
	Others         []string
	Active         int
	Paused         []int32
	OthersExpireIn time.Duration
}

// Acquired is one lease Acquire took: the cursor row as it left it.
type Acquired struct {
	Partition   int32
	Token       int64
	Cursor      int64
	Attempts    int32
	Charged     int32
	LastError   string
	Backoff     time.Duration
	SuspectFrom int64
	SuspectTo   int64
	Unexplained bool
}

// Inspection is a cursor row as Inspect reads it.
type Inspection struct {
	Cursor int64
	Owner  string // "" when released
	Token  int64
	Live   bool // unexpired
}

// NewPGStore returns the Store on PostgreSQL of the outbox schema schema,
// through pool; relaxed runs the relaxed cursor moves (nil: pool).
func NewPGStore(pool pgexec.DB, relaxed pgexec.Querier, schema string) Store {
	if relaxed == nil {
		relaxed = pool
	}
	return &pgStore{pool: pool, relaxed: relaxed, q: dbsql.For(schema), channel: names.MembersChannel(schema)}
}

type pgStore struct {
	pool    pgexec.DB
	relaxed pgexec.Querier
	q       *dbsql.Queries
	channel string // where joins and leaves are announced (names.MembersChannel)
}

// on is where a statement runs: tx, or the pool.
func (s *pgStore) on(tx pgx.Tx) (pgexec.Querier, error) {
	if tx == nil {
		return s.pool, nil
	}
	return pgexec.FromTx(tx)
}

func (s *pgStore) CreateCursors(ctx context.Context, g Group, partitions int, fromNewest bool) error {
	_, err := s.pool.Exec(ctx, s.q.CursorsCreate, g.Name, g.Topic, partitions, fromNewest)
	return err
}

func (s *pgStore) ExpireMembers(ctx context.Context, g Group, deadFor time.Duration) error {
	_, err := s.pool.Exec(ctx, s.q.MembersExpire, g.Name, g.Topic, deadFor.Microseconds())
	return err
}

func (s *pgStore) Balance(ctx context.Context, g Group, member string, ttl time.Duration, partitions int) (Balance, error) {
	var b Balance
	var expireIn, notified int64
	err := pgexec.QueryRow(ctx, s.pool, s.q.CursorsBalance,
		[]any{g.Name, g.Topic, member, ttl.Microseconds(), partitions, true, s.channel}, // can_reject: every Subscriber has a RejectHandler (older releases wrote false without one)
		&b.Others, &b.Active, &b.Paused, &expireIn, &notified)
	b.OthersExpireIn = time.Duration(expireIn) * time.Microsecond
	return b, err
}

func (s *pgStore) Acquire(ctx context.Context, g Group, member string, partitions int, exclude []int32, ttl time.Duration, n int) ([]Acquired, error) {
	if exclude == nil {
		exclude = []int32{} // NULL would exclude every partition
	}
	rows, err := s.pool.Query(ctx, s.q.CursorsAcquire, g.Name, g.Topic, member, partitions, exclude, ttl.Microseconds(), n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var got []Acquired
	for rows.Next() {
		var a Acquired
		var backoff float64
		if err := rows.Scan(&a.Partition, &a.Token, &a.Cursor, &a.Attempts, &a.Charged, &a.LastError, &backoff, &a.SuspectFrom, &a.SuspectTo, &a.Unexplained); err != nil {
			return got, fmt.Errorf("read an acquired lease: %w", err)
		}
		a.Backoff = time.Duration(backoff * float64(time.Second))
		got = append(got, a)
	}
	return got, rows.Err()
}

func (s *pgStore) Renew(ctx context.Context, g Group, member string, parts []int32, tokens []int64, ttl time.Duration) (map[int32]bool, error) {
	rows, err := s.pool.Query(ctx, s.q.CursorsRenew, g.Name, g.Topic, member, parts, tokens, ttl.Microseconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[int32]bool, len(parts))
	for rows.Next() {
		var p int32
		var renewed bool
		if err := rows.Scan(&p, &renewed); err != nil {
			return nil, fmt.Errorf("read a renewed lease: %w", err)
		}
		out[p] = renewed
	}
	return out, rows.Err()
}

func (s *pgStore) Release(ctx context.Context, g Group, member string, parts []int32, tokens []int64) ([]int32, error) {
	return s.partitions(ctx, s.q.CursorsRelease, g, member, parts, tokens, s.channel)
}

func (s *pgStore) StillHeld(ctx context.Context, g Group, member string, parts []int32, tokens []int64) ([]int32, error) {
	return s.partitions(ctx, s.q.CursorsStillHeld, g, member, parts, tokens)
}

// partitions runs stmt (CursorsRelease, CursorsStillHeld) and returns the
// partitions it returned; more are the statement's parameters after the
// tokens.
func (s *pgStore) partitions(ctx context.Context, stmt string, g Group, member string, parts []int32, tokens []int64, more ...any) ([]int32, error) {
	rows, err := s.pool.Query(ctx, stmt, append([]any{g.Name, g.Topic, member, parts, tokens}, more...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int32
	for rows.Next() {
		var p int32
		if err := rows.Scan(&p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

func (s *pgStore) Writer(ctx context.Context, f Fence) (writer string, known, held bool, err error) {
	var w *string
	err = pgexec.QueryRow(ctx, s.pool, s.q.CursorsWriter, []any{f.Name, f.Topic, f.Partition, f.Member, f.Token}, &w)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", false, false, nil
	case err != nil:
		return "", false, false, err
	case w == nil:
		return "", false, true, nil
	}
	return *w, true, true, nil
}

func (s *pgStore) SetWriter(ctx context.Context, f Fence, writer string) (bool, error) {
	n, err := s.pool.Exec(ctx, s.q.CursorsSetWriter, f.Name, f.Topic, f.Partition, f.Member, f.Token, writer)
	return n == 1, err
}

func (s *pgStore) Leave(ctx context.Context, g Group, member string) error {
	_, err := s.pool.Exec(ctx, s.q.MembersLeave, g.Name, g.Topic, member, s.channel)
	return err
}

func (s *pgStore) Advance(ctx context.Context, tx pgx.Tx, relaxed bool, f Fence, seq int64) (bool, error) {
	q, stmt := s.relaxed, s.q.CursorsAdvanceRelaxed
	if !relaxed {
		var err error
		if q, err = s.on(tx); err != nil {
			return false, err
		}
		stmt = s.q.CursorsAdvance
	}
	var unexplained int32
	err := pgexec.QueryRow(ctx, q, stmt, []any{f.Name, f.Topic, f.Partition, f.Member, f.Token, seq}, &unexplained)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func (s *pgStore) Retry(ctx context.Context, tx pgx.Tx, f Fence, text string, retryIn time.Duration) (bool, error) {
	q, err := s.on(tx)
	if err != nil {
		return false, err
	}
	n, err := q.Exec(ctx, s.q.CursorsRetry, f.Name, f.Topic, f.Partition, f.Member, f.Token, text, retryIn.Microseconds())
	return n == 1, err
}

func (s *pgStore) UndoDelivery(ctx context.Context, f Fence, cursor int64) error {
	_, err := s.pool.Exec(ctx, s.q.CursorsUndoDelivery, f.Name, f.Topic, f.Partition, f.Member, f.Token, cursor)
	return err
}

func (s *pgStore) Inspect(ctx context.Context, tx pgx.Tx, g Group, p int) (Inspection, bool, error) {
	q, err := s.on(tx)
	if err != nil {
		return Inspection{}, false, err
	}
	var in Inspection
	err = pgexec.QueryRow(ctx, q, s.q.CursorsInspect, []any{g.Name, g.Topic, p}, &in.Cursor, &in.Owner, &in.Token, &in.Live)
	if errors.Is(err, pgx.ErrNoRows) {
		return Inspection{}, false, nil
	}
	return in, err == nil, err
}
