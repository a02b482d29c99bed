// Package consumerfake is the in-memory database the consumer core's unit
// tests drive a Worker with: Store (the log, the cursor row, the held
// rows, transactions) and Lease (the partition's lease on that cursor
// row), implementing internal/consumer/seam's Store and Lease. They keep
// what the PostgreSQL statements keep (internal/dbsql's log.sql,
// cursors.sql, held.sql, transaction.sql), with the same fencing, so that
// a test asserts on the state a worker leaves, not on the calls it makes.
// integration/consumerstore runs the same scenarios through this package
// and through PostgreSQL (consumer.PGStore and internal/lease) and
// compares every answer and the rows left: the fake is pinned to the SQL.
//
// One Store is one topic's one partition of one consumer group: the topic
// and partition arguments are ignored. It is a test double: only tests
// import it (deps_test.go keeps it out of the library's packages).
package consumerfake

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/watermill-outbox/internal/consumer/seam"
	"github.com/millrace/watermill-outbox/internal/lease"
)

// CursorRow is the cursor row of the fake's one partition.
type CursorRow struct {
	Seq, Deliveries, Attempts int64
	InflightFrom, InflightTo  int64
	InflightSolo              bool
	// Unexplained counts the head's deliveries that ended in a crash
	// nobody was charged for; SuspectFrom..SuspectTo are the messages in
	// flight then, delivered alone (0, 0 for none): NewLease settles a
	// delivery left in flight into them, as CursorsAcquire does.
	Unexplained            int64
	SuspectFrom, SuspectTo int64
	LastError              string
	Backoff                time.Duration
	// BackoffUntil is when the head's retry is due (RecordRetry); a new
	// lease's Found.Backoff is what is left of it.
	BackoffUntil time.Time
	Adaptive     string
	// Full: the partition blocks because its isolation bounds are
	// reached (HeldShowFull).
	Full bool
}

// Held is a held message of the fake.
type Held struct {
	seam.Hold
	Deliveries int
	// Unexplained counts the retries that ended without an outcome while
	// others were in flight (HeldAdopt): the message is a suspect.
	Unexplained  int
	Inflight     bool
	Solo         bool
	FirstFailure time.Time
	RetryAt      time.Time
	Requested    string
}

// Store is the seam.Store of one topic and one partition, in memory. A
// test reads and edits its fields under Mu.
type Store struct {
	Mu     sync.Mutex
	Log    []seam.Entry // seqs 1..n
	Cursor CursorRow
	Held   map[int64]*Held
	// Lost: another member took the lease over (a new owner and token):
	// every fenced write fails. Expired: the lease expired, nobody took
	// it: the writes fenced by the expiry fail, those fenced by the owner
	// and token only (SaveAdaptive, HeldShowFull) do not.
	Lost, Expired bool
	Reads         []ReadCall
	Marks         []int64
	Commits       int
	Rollbacks     int
	// RelaxedCommits counts the transactions of InTx asked to commit
	// without waiting for their WAL flush (relaxed), which a test tells
	// from the others.
	RelaxedCommits int
	Effects        []string // the handlers' writes, as committed
	// Fail injects an error into the named operation's next call: "read",
	// "begin", "savepoint", "mark", "commit".
	Fail map[string]error
}

var _ seam.Store = (*Store)(nil)

// ReadCall is a fenced read as the worker asked for it.
type ReadCall struct {
	Cursor     int64
	Limit      int
	WholeBatch bool
	Solo       bool
}

// New returns a Store whose log holds messages with the given payloads.
func New(payloads ...string) *Store {
	s := &Store{Held: map[int64]*Held{}, Fail: map[string]error{}}
	for _, p := range payloads {
		s.Append(seam.Entry{Payload: []byte(p)})
	}
	return s
}

// Append adds e to the log with the next seq (and a uuid from it, when e
// has none).
func (s *Store) Append(e seam.Entry) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	e.Seq = int64(len(s.Log) + 1)
	if e.UUID == "" {
		e.UUID = fmt.Sprintf("m%d", e.Seq)
	}
	s.Log = append(s.Log, e)
}

// gone reports whether the writes fenced by the lease's expiry fail.
func (s *Store) gone() bool { return s.Lost || s.Expired }

// failing takes the error injected into op, if any.
func (s *Store) failing(op string) error {
	err := s.Fail[op]
	delete(s.Fail, op)
	return err
}

// State is the cursor row.
func (s *Store) State() CursorRow {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	return s.Cursor
}

// Read implements seam.Store.
func (s *Store) Read(_ context.Context, _ string, _ int, cursor int64, limit int, fence seam.Lease, wholeBatch, solo bool) ([]seam.Entry, *int32, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if err := s.failing("read"); err != nil {
		return nil, nil, err
	}
	var out []seam.Entry
	for _, e := range s.Log {
		if e.Seq > cursor && len(out) < limit {
			out = append(out, e)
		}
	}
	if fence == nil {
		return out, nil, nil
	}
	s.Reads = append(s.Reads, ReadCall{cursor, limit, wholeBatch, solo})
	if s.gone() || s.Cursor.Seq != cursor || len(out) == 0 || out[0].Seq != cursor+1 {
		return out, nil, nil
	}
	s.Cursor.Deliveries = max(s.Cursor.Deliveries, s.Cursor.Attempts) + 1
	s.Cursor.InflightFrom, s.Cursor.InflightTo, s.Cursor.InflightSolo = cursor+1, cursor+1, solo
	if wholeBatch {
		s.Cursor.InflightTo = out[len(out)-1].Seq
	}
	n := int32(s.Cursor.Deliveries)
	return out, &n, nil
}

// ReadSeqs implements seam.Store.
func (s *Store) ReadSeqs(_ context.Context, _ string, _ int, seqs []int64) ([]seam.Entry, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	var out []seam.Entry
	for _, e := range s.Log {
		for _, q := range seqs {
			if e.Seq == q {
				out = append(out, e)
				break
			}
		}
	}
	return out, nil
}

// Begin implements seam.Store.
func (s *Store) Begin(context.Context) (pgx.Tx, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if err := s.failing("begin"); err != nil {
		return nil, err
	}
	return &Tx{s: s}, nil
}

// InTx implements seam.Store.
func (s *Store) InTx(ctx context.Context, relaxed bool, fn func(pgx.Tx) error) error {
	tx, err := s.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if relaxed {
		s.Mu.Lock()
		s.RelaxedCommits++
		s.Mu.Unlock()
	}
	return nil
}

// Savepoint implements seam.Store.
func (s *Store) Savepoint(_ context.Context, tx pgx.Tx, op seam.SavepointOp) error {
	t := tx.(*Tx)
	s.Mu.Lock()
	err := s.failing("savepoint")
	s.Mu.Unlock()
	if err != nil {
		return err
	}
	if t.done {
		return pgx.ErrTxClosed
	}
	const delivery, batch = "outbox_delivery", "outbox_batch" // transaction.sql's
	switch op {
	case seam.SavepointFirst:
		return t.savepoint(delivery)
	case seam.SavepointNext:
		if err := t.release(delivery); err != nil {
			return err
		}
		return t.savepoint(delivery)
	case seam.SavepointRelease:
		return t.release(delivery)
	case seam.SavepointRollback:
		return t.rollbackTo(delivery)
	case seam.SavepointBatch:
		return t.savepoint(batch)
	case seam.SavepointBatchRelease:
		return t.release(batch)
	case seam.SavepointBatchRollback:
		return t.rollbackTo(batch)
	}
	return fmt.Errorf("fake: savepoint operation %d", op)
}

// SaveAdaptive implements seam.Store.
func (s *Store) SaveAdaptive(_ context.Context, _ string, _ int, _ int64, state string, _ int) error {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if !s.Lost { // fenced by the token (another holder's is larger)
		s.Cursor.Adaptive = state
	}
	return nil
}

// MarkInFlight implements seam.Store.
func (s *Store) MarkInFlight(_ context.Context, _ string, _ seam.Lease, seq int64) (bool, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if err := s.failing("mark"); err != nil {
		return false, err
	}
	if s.gone() || seq <= s.Cursor.Seq {
		return false, nil
	}
	s.Marks = append(s.Marks, seq)
	s.Cursor.InflightFrom, s.Cursor.InflightTo, s.Cursor.InflightSolo = seq, seq, false
	return true, nil
}

// HeldAdopt implements seam.HeldStore: a retry the last holder left in
// flight alone in its process is charged as a failed attempt (with the
// message's unexplained deliveries), any other is counted unexplained.
func (s *Store) HeldAdopt(context.Context, string, seam.Lease) error {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if s.gone() {
		return nil
	}
	now := time.Now()
	for _, h := range s.Held {
		if !h.Inflight {
			continue
		}
		if h.Solo {
			h.Attempts = min(h.Attempts+1+h.Unexplained, 2147483646)
			h.Unexplained = 0
			h.Err = fmt.Sprintf("seq %d: the consumer process died while this retry was the only delivery in flight in it", h.Seq)
		} else {
			h.Unexplained++
			if h.Err == "" {
				h.Err = fmt.Sprintf("seq %d: the consumer process died with other deliveries in flight: nobody is charged; the message is retried alone", h.Seq)
			}
		}
		h.Inflight, h.Solo = false, false
		if h.FirstFailure.IsZero() {
			h.FirstFailure = now
		}
	}
	return nil
}

// HeldLoad implements seam.HeldStore.
func (s *Store) HeldLoad(context.Context, string, int) ([]seam.HeldRow, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	var out []seam.HeldRow
	for _, h := range s.Held {
		r := seam.HeldRow{Seq: h.Seq, Keyless: h.Keyless, Key: h.Key, Attempts: h.Attempts, Deliveries: h.Deliveries, LastError: h.Err,
			Requested: h.Requested, Suspect: h.Unexplained > 0}
		if !h.FirstFailure.IsZero() {
			at := h.FirstFailure
			r.FirstFailure = &at
		}
		if !h.RetryAt.IsZero() {
			at := h.RetryAt
			r.RetryAt = &at
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// HeldInsert implements seam.HeldStore.
func (s *Store) HeldInsert(_ context.Context, tx pgx.Tx, _ string, _ int, rows []seam.Hold) error {
	tx.(*Tx).Do(func() {
		for _, r := range rows {
			if s.Held[r.Seq] == nil {
				h := &Held{Hold: r, Deliveries: r.Attempts}
				if r.Err != "" {
					h.FirstFailure = time.Now()
					h.RetryAt = h.FirstFailure.Add(r.Delay)
				}
				s.Held[r.Seq] = h
			}
		}
	})
	return nil
}

// HeldCount implements seam.HeldStore.
func (s *Store) HeldCount(_ context.Context, _ string, _ seam.Lease, seq int64, solo bool) (int, bool, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	h := s.Held[seq]
	if s.gone() || h == nil {
		return 0, false, nil
	}
	h.Deliveries = max(h.Deliveries, h.Attempts+h.Unexplained) + 1
	h.Inflight, h.Solo = true, solo
	return h.Deliveries, true, nil
}

// HeldUndoCount implements seam.HeldStore.
func (s *Store) HeldUndoCount(_ context.Context, _ string, _ seam.Lease, seq int64) error {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if h := s.Held[seq]; h != nil && !s.gone() {
		h.Deliveries = max(h.Deliveries-1, h.Attempts+h.Unexplained)
		h.Inflight, h.Solo = false, false
	}
	return nil
}

// HeldRetry implements seam.HeldStore.
func (s *Store) HeldRetry(_ context.Context, _ string, _ seam.Lease, seq int64, text string, delay time.Duration) (bool, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	h := s.Held[seq]
	if s.gone() || h == nil {
		return false, nil
	}
	now := time.Now()
	h.Attempts = min(h.Attempts+1, 2147483647)
	h.Deliveries = min(max(h.Attempts+h.Unexplained, h.Deliveries), 2147483647)
	h.Err, h.RetryAt, h.Inflight, h.Solo = text, now.Add(delay), false, false
	if h.FirstFailure.IsZero() {
		h.FirstFailure = now
	}
	return true, nil
}

// HeldRelease implements seam.HeldStore.
func (s *Store) HeldRelease(_ context.Context, tx pgx.Tx, _ string, _ seam.Lease, seqs []int64) (int, error) {
	release := func() {
		for _, q := range seqs {
			delete(s.Held, q)
		}
	}
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if s.gone() {
		return 0, nil
	}
	n := 0
	for q := range slices.Values(dedup(seqs)) {
		if s.Held[q] != nil {
			n++
		}
	}
	if tx != nil {
		tx.(*Tx).Do(release)
	} else {
		release()
	}
	return n, nil
}

// HeldShowFull implements seam.HeldStore.
func (s *Store) HeldShowFull(_ context.Context, _ string, _ seam.Lease, full bool) error {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if !s.Lost {
		s.Cursor.Full = full
	}
	return nil
}

// dedup is seqs without repeats.
func dedup(seqs []int64) []int64 {
	out := slices.Clone(seqs)
	slices.Sort(out)
	return slices.Compact(out)
}

// CommittedEffects are the effects of committed transactions (the
// handlers' writes, see Tx.Exec), in commit order.
func (s *Store) CommittedEffects() []string {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	return append([]string(nil), s.Effects...)
}

// Tx is a transaction of the fake: its writes apply at Commit. A handler
// of the Transactional strategy writes through Exec (recorded as an
// effect); a statement after "FAIL" aborts it, as a failed statement
// aborts a PostgreSQL transaction.
type Tx struct {
	s   *Store
	ops []func()
	// savepoints is PostgreSQL's stack of savepoints: a name (not
	// unique: the latest one counts) and len(ops) when it was set.
	savepoints []savepoint
	aborted    bool
	done       bool
}

type savepoint struct {
	name string
	mark int
}

var _ pgx.Tx = (*Tx)(nil)

// errAborted is a statement in an aborted transaction.
var errAborted = &pgconn.PgError{Code: "25P02", Message: "current transaction is aborted, commands ignored until end of transaction block"}

// fail aborts the transaction with a statement's error.
func (t *Tx) fail(err *pgconn.PgError) error {
	t.aborted = true
	return err
}

// find is the stack position of the latest savepoint name, or -1.
func (t *Tx) find(name string) int {
	for i := len(t.savepoints) - 1; i >= 0; i-- {
		if t.savepoints[i].name == name {
			return i
		}
	}
	return -1
}

// savepoint is SAVEPOINT name.
func (t *Tx) savepoint(name string) error {
	if t.aborted {
		return errAborted
	}
	t.savepoints = append(t.savepoints, savepoint{name, len(t.ops)})
	return nil
}

// release is RELEASE SAVEPOINT name: it and every later one are gone,
// their writes kept.
func (t *Tx) release(name string) error {
	if t.aborted {
		return errAborted
	}
	i := t.find(name)
	if i < 0 {
		return t.fail(&pgconn.PgError{Code: "3B001", Message: "savepoint " + name + " does not exist"})
	}
	t.savepoints = t.savepoints[:i]
	return nil
}

// rollbackTo is ROLLBACK TO SAVEPOINT name: the writes since it are
// undone, the later savepoints gone, it kept, the transaction usable
// again.
func (t *Tx) rollbackTo(name string) error {
	i := t.find(name)
	if i < 0 {
		return t.fail(&pgconn.PgError{Code: "3B001", Message: "savepoint " + name + " does not exist"})
	}
	t.ops = t.ops[:t.savepoints[i].mark]
	t.savepoints = t.savepoints[:i+1]
	t.aborted = false
	return nil
}

// Do applies op at Commit (unless a savepoint rollback takes it back).
func (t *Tx) Do(op func()) { t.ops = append(t.ops, op) }

// Begin implements pgx.Tx: no nested transactions.
func (t *Tx) Begin(context.Context) (pgx.Tx, error) {
	return nil, errors.New("fake: no nested transactions")
}

// Commit implements pgx.Tx.
func (t *Tx) Commit(context.Context) error {
	t.s.Mu.Lock()
	defer t.s.Mu.Unlock()
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	if err := t.s.failing("commit"); err != nil {
		return err
	}
	if t.aborted {
		return pgx.ErrTxCommitRollback // PostgreSQL's COMMIT of an aborted transaction rolls it back
	}
	for _, op := range t.ops {
		op()
	}
	t.s.Commits++
	return nil
}

// Rollback implements pgx.Tx.
func (t *Tx) Rollback(context.Context) error {
	t.s.Mu.Lock()
	defer t.s.Mu.Unlock()
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	t.s.Rollbacks++
	return nil
}

// CopyFrom implements pgx.Tx: no COPY.
func (t *Tx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errors.New("fake: no COPY")
}

// SendBatch implements pgx.Tx: no batches.
func (t *Tx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults { return nil }

// LargeObjects implements pgx.Tx: none.
func (t *Tx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

// Prepare implements pgx.Tx: no prepared statements.
func (t *Tx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, errors.New("fake: no Prepare")
}

// Exec records sql as an effect of the transaction; "FAIL" aborts it.
func (t *Tx) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	if t.done {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if t.aborted {
		return pgconn.CommandTag{}, errAborted
	}
	if sql == "FAIL" {
		t.aborted = true
		return pgconn.CommandTag{}, &pgconn.PgError{Code: "23505", Message: "duplicate key"}
	}
	t.Do(func() { t.s.Effects = append(t.s.Effects, sql) })
	return pgconn.NewCommandTag("INSERT 0 1"), nil
}

// Query implements pgx.Tx: no queries.
func (t *Tx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("fake: no Query")
}

// QueryRow implements pgx.Tx: no queries.
func (t *Tx) QueryRow(context.Context, string, ...any) pgx.Row { return nil }

// Conn implements pgx.Tx: no connection.
func (t *Tx) Conn() *pgx.Conn { return nil }

// Found is what an acquisition of the lease found on the cursor row (see
// internal/lease's Lease): the cursor, the head's failed attempts and last error, the
// backoff left, the attempts charged for a crash, the suspects and
// whether it found a crash nobody could be charged for.
type Found struct {
	Cursor                 int64
	Attempts, Charged      int
	LastError              string
	Backoff                time.Duration
	SuspectFrom, SuspectTo int64
	Unexplained            bool
}

// Lease is the seam.Lease on the fake's partition 0, held by "me" with
// token 1.
type Lease struct {
	S      *Store
	ctx    context.Context
	cancel context.CancelCauseFunc
	// Found is what the acquisition found; NewLease takes the attempts
	// and the last error from the cursor row, a test sets the rest.
	Found Found
	// RelaxedMoves counts the cursor moves made with AdvanceRelaxed (on
	// PostgreSQL: committed without waiting for their WAL flush), which
	// a test tells from Advance's.
	RelaxedMoves atomic.Int64
}

var _ seam.Lease = (*Lease)(nil)

// NewLease acquires the lease on s's partition (again, after Lose: its
// fenced writes hold from now on), as CursorsAcquire does: a delivery the
// last holder left in flight on the cursor row is charged to the head when
// it was the only one in flight in its process, else it makes suspects.
// Found is what the acquisition found; a test may set it otherwise.
func NewLease(s *Store) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	s.Mu.Lock()
	defer s.Mu.Unlock()
	s.Lost, s.Expired = false, false
	c, old := &s.Cursor, s.Cursor
	solo := old.InflightTo > old.Seq && old.InflightSolo && old.InflightFrom == old.Seq+1 && old.InflightTo == old.Seq+1
	unexplained := old.InflightTo > old.Seq && !solo
	switch {
	case solo:
		c.Attempts = min(old.Attempts+1+old.Unexplained, 2147483646)
		c.Unexplained = 0
		c.LastError = fmt.Sprintf("seq %d: the consumer process died while this message was the only delivery in flight in it (delivery %d)", old.Seq+1, old.Deliveries)
	case unexplained:
		if old.Seq+1 >= old.InflightFrom && old.Seq+1 <= old.InflightTo {
			c.Unexplained = old.Unexplained + 1
		}
		from := max(old.InflightFrom, old.Seq+1)
		if old.SuspectTo > old.Seq {
			from = min(old.SuspectFrom, from)
		}
		c.SuspectFrom, c.SuspectTo = from, max(old.SuspectTo, old.InflightTo)
		if old.LastError == "" {
			c.LastError = fmt.Sprintf("seq %d..%d: the consumer process died with other deliveries in flight: nobody is charged; these messages are delivered alone until the one that crashes it is found", old.InflightFrom, old.InflightTo)
		}
	}
	c.InflightFrom, c.InflightTo, c.InflightSolo = 0, 0, false
	found := Found{Cursor: c.Seq, Attempts: int(c.Attempts), Charged: int(c.Attempts - old.Attempts), LastError: c.LastError,
		Backoff: max(time.Until(c.BackoffUntil), 0), Unexplained: unexplained}
	if c.SuspectTo > c.Seq {
		found.SuspectFrom, found.SuspectTo = c.SuspectFrom, c.SuspectTo
	}
	return &Lease{S: s, ctx: ctx, cancel: cancel, Found: found}
}

// Partition implements seam.Lease.
func (l *Lease) Partition() int { return 0 }

// Context implements seam.Lease.
func (l *Lease) Context() context.Context { return l.ctx }

// Owner implements seam.Lease.
func (l *Lease) Owner() string { return "me" }

// Token implements seam.Lease.
func (l *Lease) Token() int64 { return 1 }

// Cursor implements seam.Lease: the cursor row's seq at acquisition.
func (l *Lease) Cursor() int64 { return l.Found.Cursor }

// Attempts implements seam.Lease.
func (l *Lease) Attempts() int { return l.Found.Attempts }

// LastError implements seam.Lease.
func (l *Lease) LastError() string { return l.Found.LastError }

// Backoff implements seam.Lease.
func (l *Lease) Backoff() time.Duration { return l.Found.Backoff }

// Charged implements seam.Lease.
func (l *Lease) Charged() int { return l.Found.Charged }

// Suspects implements seam.Lease.
func (l *Lease) Suspects() (from, to int64) { return l.Found.SuspectFrom, l.Found.SuspectTo }

// UnexplainedCrash implements seam.Lease.
func (l *Lease) UnexplainedCrash() bool { return l.Found.Unexplained }

// Cancel ends the lease's context with cause (a release, the
// subscription's stop), its fenced writes still holding.
func (l *Lease) Cancel(cause error) { l.cancel(cause) }

// Expire lets the lease expire with nobody taking it over: the writes
// fenced by the expiry fail from now on (and end the lease's context).
func (l *Lease) Expire() {
	l.S.Mu.Lock()
	defer l.S.Mu.Unlock()
	l.S.Expired = true
}

// Lose ends the lease: its context, and every fenced write from now on.
func (l *Lease) Lose() {
	l.S.Mu.Lock()
	l.S.Lost = true
	l.S.Mu.Unlock()
	l.cancel(lease.ErrLeaseLost)
}

// write applies op to the cursor row in tx (at its commit), or at once,
// when the lease holds (ErrLeaseLost otherwise, with the lease's context
// ended) and ahead(the cursor row) does (ErrSeqNotAhead otherwise, at
// seq); ahead nil: no condition.
func (l *Lease) write(tx pgx.Tx, seq int64, ahead func(c CursorRow) bool, op func(c *CursorRow)) error {
	l.S.Mu.Lock()
	defer l.S.Mu.Unlock()
	if l.S.gone() {
		l.cancel(lease.ErrLeaseLost)
		return fmt.Errorf("%w: fake", lease.ErrLeaseLost)
	}
	if ahead != nil && !ahead(l.S.Cursor) {
		return fmt.Errorf("%w: fake: seq %d, cursor %d", lease.ErrSeqNotAhead, seq, l.S.Cursor.Seq)
	}
	apply := func() { op(&l.S.Cursor) }
	if tx != nil {
		tx.(*Tx).Do(apply)
		return nil
	}
	apply()
	return nil
}

// Advance implements seam.Lease.
func (l *Lease) Advance(_ context.Context, tx pgx.Tx, seq int64) error {
	return l.write(tx, seq, func(c CursorRow) bool { return c.Seq < seq }, func(c *CursorRow) {
		next := CursorRow{Seq: seq, Adaptive: c.Adaptive, Full: c.Full}
		if seq+1 >= c.SuspectFrom && seq+1 <= c.SuspectTo {
			// The next message is a suspect: it starts with the delivery
			// it had without an outcome.
			next.Unexplained, next.Deliveries = 1, 1
		}
		if seq < c.SuspectTo {
			next.SuspectFrom, next.SuspectTo = c.SuspectFrom, c.SuspectTo
		}
		*c = next
	})
}

// AdvanceRelaxed implements seam.Lease.
func (l *Lease) AdvanceRelaxed(ctx context.Context, seq int64) error {
	err := l.Advance(ctx, nil, seq)
	if err == nil {
		l.RelaxedMoves.Add(1)
	}
	return err
}

// RecordRetry implements seam.Lease.
func (l *Lease) RecordRetry(_ context.Context, tx pgx.Tx, cause error, retryIn time.Duration) error {
	return l.write(tx, -1, nil, func(c *CursorRow) {
		c.Attempts = min(c.Attempts, 2147483646) + 1
		c.LastError, c.Backoff, c.BackoffUntil = cause.Error(), retryIn, time.Now().Add(retryIn)
		c.InflightFrom, c.InflightTo, c.InflightSolo = 0, 0, false
	})
}

// UndoDelivery implements seam.Lease: fenced, and nothing to undo (the
// lease gone, the cursor moved, nothing in flight) is no error.
func (l *Lease) UndoDelivery(_ context.Context, cursor int64) error {
	l.S.Mu.Lock()
	defer l.S.Mu.Unlock()
	if c := &l.S.Cursor; !l.S.gone() && c.Seq == cursor && c.InflightTo > c.Seq {
		c.Deliveries = max(c.Deliveries-1, c.Attempts+c.Unexplained)
		c.InflightFrom, c.InflightTo, c.InflightSolo = 0, 0, false
	}
	return nil
}

// Verify implements seam.Lease: ErrLeaseLost (with the lease's context
// ended) when the lease is gone, else ErrSeqNotAhead when seq >= 0 (the
// cursor is not at seq), else an error of no class.
func (l *Lease) Verify(_ context.Context, op string, seq int64) error {
	l.S.Mu.Lock()
	defer l.S.Mu.Unlock()
	switch {
	case l.S.gone():
		l.cancel(lease.ErrLeaseLost)
		return fmt.Errorf("%w: fake: %s", lease.ErrLeaseLost, op)
	case seq >= 0:
		return fmt.Errorf("fake: %s: the cursor is not at %d: %w", op, seq, lease.ErrSeqNotAhead)
	}
	return fmt.Errorf("fake: %s changed nothing although the lease is valid", op)
}
