package consumer

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/internal/worker"
)

// The in-memory parts the unit tests drive a Worker with: fakeStore (the
// log, the cursor row, held rows, transactions) and fakeLease (the
// partition's lease on that cursor row). They keep what the PostgreSQL
// statements keep, with the same fencing, so that a test asserts on the
// state a worker leaves, not on the calls it makes.

// cursorRow is the cursor row of the fake's one partition.
type cursorRow struct {
	seq, deliveries, attempts int64
	inflightFrom, inflightTo  int64
	inflightSolo              bool
	lastError                 string
	backoff                   time.Duration
	adaptive                  string
}

// heldRow is a held message of the fake.
type heldRow struct {
	Hold
	deliveries int
	inflight   bool
	solo       bool
	retryAt    time.Time
	requested  string
}

// fakeStore is the Store of one topic and one partition, in memory.
type fakeStore struct {
	mu       sync.Mutex
	log      []Entry // seqs 1..n
	cursor   cursorRow
	held     map[int64]*heldRow
	lost     bool // the lease is gone: every fenced write fails
	reads    []readCall
	marks    []int64
	commits  int
	rollback int
	effects  []string // the handlers' writes, as committed
	// fail injects an error into the named operation's next call.
	fail map[string]error
}

// readCall is a fenced read as the worker asked for it.
type readCall struct {
	cursor     int64
	limit      int
	wholeBatch bool
	solo       bool
}

func newFakeStore(payloads ...string) *fakeStore {
	s := &fakeStore{held: map[int64]*heldRow{}, fail: map[string]error{}}
	for _, p := range payloads {
		s.append(Entry{Payload: []byte(p)})
	}
	return s
}

// append adds e to the log with the next seq (and a uuid from it).
func (s *fakeStore) append(e Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e.Seq = int64(len(s.log) + 1)
	if e.UUID == "" {
		e.UUID = fmt.Sprintf("m%d", e.Seq)
	}
	s.log = append(s.log, e)
}

// failing takes the error injected into op, if any.
func (s *fakeStore) failing(op string) error {
	err := s.fail[op]
	delete(s.fail, op)
	return err
}

func (s *fakeStore) state() cursorRow {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor
}

func (s *fakeStore) Read(_ context.Context, _ string, _ int, cursor int64, limit int, fence Lease, wholeBatch, solo bool) ([]Entry, *int32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failing("read"); err != nil {
		return nil, nil, err
	}
	var out []Entry
	for _, e := range s.log {
		if e.Seq > cursor && len(out) < limit {
			out = append(out, e)
		}
	}
	if fence == nil {
		return out, nil, nil
	}
	s.reads = append(s.reads, readCall{cursor, limit, wholeBatch, solo})
	if s.lost || s.cursor.seq != cursor || len(out) == 0 || out[0].Seq != cursor+1 {
		return out, nil, nil
	}
	s.cursor.deliveries = max(s.cursor.deliveries, s.cursor.attempts) + 1
	s.cursor.inflightFrom, s.cursor.inflightTo, s.cursor.inflightSolo = cursor+1, cursor+1, solo
	if wholeBatch {
		s.cursor.inflightTo = out[len(out)-1].Seq
	}
	n := int32(s.cursor.deliveries)
	return out, &n, nil
}

func (s *fakeStore) ReadSeqs(_ context.Context, _ string, _ int, seqs []int64) ([]Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Entry
	for _, e := range s.log {
		for _, q := range seqs {
			if e.Seq == q {
				out = append(out, e)
			}
		}
	}
	return out, nil
}

func (s *fakeStore) Begin(context.Context) (pgx.Tx, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failing("begin"); err != nil {
		return nil, err
	}
	return &fakeTx{s: s}, nil
}

func (s *fakeStore) InTx(ctx context.Context, _ bool, fn func(pgx.Tx) error) error {
	tx, err := s.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}

func (s *fakeStore) Savepoint(_ context.Context, tx pgx.Tx, op SavepointOp) error {
	t := tx.(*fakeTx)
	s.mu.Lock()
	err := s.failing("savepoint")
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if t.aborted && op != SavepointRollback && op != SavepointBatchRollback {
		return &pgconn.PgError{Code: "25P02", Message: "current transaction is aborted"}
	}
	switch op {
	case SavepointFirst, SavepointNext, SavepointBatch:
		t.mark = len(t.ops)
	case SavepointRollback, SavepointBatchRollback:
		t.ops = t.ops[:t.mark]
		t.aborted = false
	}
	return nil
}

func (s *fakeStore) SaveAdaptive(_ context.Context, _ string, _ int, _ int64, state string, _ int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cursor.adaptive = state
	return nil
}

func (s *fakeStore) MarkInFlight(_ context.Context, _ string, _ Lease, seq int64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failing("mark"); err != nil {
		return false, err
	}
	if s.lost {
		return false, nil
	}
	s.marks = append(s.marks, seq)
	s.cursor.inflightFrom, s.cursor.inflightTo, s.cursor.inflightSolo = seq, seq, false
	return true, nil
}

func (s *fakeStore) HeldAdopt(context.Context, string, Lease) error { return nil }

func (s *fakeStore) HeldLoad(context.Context, string, int) ([]HeldRow, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []HeldRow
	for _, h := range s.held {
		r := HeldRow{Seq: h.Seq, Keyless: h.Keyless, Key: h.Key, Attempts: h.Attempts, Deliveries: h.deliveries, LastError: h.Err, Requested: h.requested}
		if !h.retryAt.IsZero() {
			at := h.retryAt
			r.RetryAt = &at
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

func (s *fakeStore) HeldInsert(_ context.Context, tx pgx.Tx, _ string, _ int, rows []Hold) error {
	tx.(*fakeTx).do(func() {
		for _, r := range rows {
			if s.held[r.Seq] == nil {
				h := &heldRow{Hold: r, deliveries: r.Attempts}
				if r.Err != "" {
					h.retryAt = time.Now().Add(r.Delay)
				}
				s.held[r.Seq] = h
			}
		}
	})
	return nil
}

func (s *fakeStore) HeldCount(_ context.Context, _ string, _ Lease, seq int64, solo bool) (int, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.held[seq]
	if s.lost || h == nil {
		return 0, false, nil
	}
	h.deliveries = max(h.deliveries, h.Attempts) + 1
	h.inflight, h.solo = true, solo
	return h.deliveries, true, nil
}

func (s *fakeStore) HeldUndoCount(_ context.Context, _ string, _ Lease, seq int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.held[seq]; h != nil {
		h.deliveries = max(h.deliveries-1, h.Attempts)
		h.inflight = false
	}
	return nil
}

func (s *fakeStore) HeldRetry(_ context.Context, _ string, _ Lease, seq int64, text string, delay time.Duration) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.held[seq]
	if s.lost || h == nil {
		return false, nil
	}
	h.Attempts++
	h.Err, h.retryAt, h.inflight = text, time.Now().Add(delay), false
	return true, nil
}

func (s *fakeStore) HeldRelease(_ context.Context, tx pgx.Tx, _ string, _ Lease, seqs []int64) (int, error) {
	release := func() {
		for _, q := range seqs {
			delete(s.held, q)
		}
	}
	if tx != nil {
		tx.(*fakeTx).do(release)
		return len(seqs), nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost {
		return 0, nil
	}
	n := 0
	for _, q := range seqs {
		if s.held[q] != nil {
			n++
		}
	}
	release()
	return n, nil
}

func (s *fakeStore) HeldShowFull(context.Context, string, Lease, bool) error { return nil }

// fakeTx is a transaction of the fake: its writes apply at Commit. A
// handler of the Transactional strategy writes through Exec (recorded as
// an effect); a statement after "FAIL" aborts it, as a failed statement
// aborts a PostgreSQL transaction.
type fakeTx struct {
	s       *fakeStore
	ops     []func()
	mark    int // the last savepoint: len(ops) when it was set
	aborted bool
	done    bool
}

// do applies op at Commit.
func (t *fakeTx) do(op func()) { t.ops = append(t.ops, op) }

func (t *fakeTx) Begin(context.Context) (pgx.Tx, error) {
	return nil, errors.New("fake: no nested transactions")
}

func (t *fakeTx) Commit(context.Context) error {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	if err := t.s.failing("commit"); err != nil {
		return err
	}
	if t.aborted {
		return &pgconn.PgError{Code: "25P02"}
	}
	for _, op := range t.ops {
		op()
	}
	t.s.commits++
	return nil
}

func (t *fakeTx) Rollback(context.Context) error {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	if !t.done {
		t.done = true
		t.s.rollback++
	}
	return nil
}

func (t *fakeTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errors.New("fake: no COPY")
}
func (t *fakeTx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults { return nil }
func (t *fakeTx) LargeObjects() pgx.LargeObjects                         { return pgx.LargeObjects{} }
func (t *fakeTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, errors.New("fake: no Prepare")
}

// Exec records sql as an effect of the transaction; "FAIL" aborts it.
func (t *fakeTx) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	if t.done {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if t.aborted {
		return pgconn.CommandTag{}, &pgconn.PgError{Code: "25P02"}
	}
	if sql == "FAIL" {
		t.aborted = true
		return pgconn.CommandTag{}, &pgconn.PgError{Code: "23505", Message: "duplicate key"}
	}
	t.do(func() { t.s.effects = append(t.s.effects, sql) })
	return pgconn.NewCommandTag("INSERT 0 1"), nil
}
func (t *fakeTx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("fake: no Query")
}
func (t *fakeTx) QueryRow(context.Context, string, ...any) pgx.Row { return nil }
func (t *fakeTx) Conn() *pgx.Conn                                  { return nil }

// effects of committed transactions (handler writes), in commit order.
func (s *fakeStore) committedEffects() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.effects...)
}

// fakeLease is the lease on the fake's partition 0.
type fakeLease struct {
	s      *fakeStore
	ctx    context.Context
	cancel context.CancelCauseFunc
	// what the acquisition found
	attempts, charged int
	lastError         string
	backoff           time.Duration
	suspects          span
	unexplained       bool
}

func newFakeLease(s *fakeStore) *fakeLease {
	ctx, cancel := context.WithCancelCause(context.Background())
	s.mu.Lock()
	l := &fakeLease{s: s, ctx: ctx, cancel: cancel, attempts: int(s.cursor.attempts), lastError: s.cursor.lastError}
	s.mu.Unlock()
	return l
}

func (l *fakeLease) Partition() int             { return 0 }
func (l *fakeLease) Context() context.Context   { return l.ctx }
func (l *fakeLease) Owner() string              { return "me" }
func (l *fakeLease) Token() int64               { return 1 }
func (l *fakeLease) Cursor() int64              { return l.s.state().seq }
func (l *fakeLease) Attempts() int              { return l.attempts }
func (l *fakeLease) LastError() string          { return l.lastError }
func (l *fakeLease) Backoff() time.Duration     { return l.backoff }
func (l *fakeLease) Charged() int               { return l.charged }
func (l *fakeLease) Suspects() (from, to int64) { return l.suspects.from, l.suspects.to }
func (l *fakeLease) UnexplainedCrash() bool     { return l.unexplained }

// lose ends the lease: its context, and every fenced write from now on.
func (l *fakeLease) lose() {
	l.s.mu.Lock()
	l.s.lost = true
	l.s.mu.Unlock()
	l.cancel(lease.ErrLeaseLost)
}

// write applies op to the cursor row in tx (at its commit), or at once.
func (l *fakeLease) write(tx pgx.Tx, op func(c *cursorRow)) error {
	apply := func() { op(&l.s.cursor) }
	if tx != nil {
		tx.(*fakeTx).do(apply)
		return nil
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.lost {
		return fmt.Errorf("%w: fake", lease.ErrLeaseLost)
	}
	apply()
	return nil
}

func (l *fakeLease) Advance(_ context.Context, tx pgx.Tx, seq int64) error {
	return l.write(tx, func(c *cursorRow) {
		*c = cursorRow{seq: seq, adaptive: c.adaptive}
	})
}

func (l *fakeLease) AdvanceRelaxed(ctx context.Context, seq int64) error {
	return l.Advance(ctx, nil, seq)
}

func (l *fakeLease) RecordRetry(_ context.Context, tx pgx.Tx, cause error, retryIn time.Duration) error {
	return l.write(tx, func(c *cursorRow) {
		c.attempts++
		c.lastError, c.backoff = cause.Error(), retryIn
		c.inflightFrom, c.inflightTo, c.inflightSolo = 0, 0, false
	})
}

func (l *fakeLease) UndoDelivery(_ context.Context, cursor int64) error {
	return l.write(nil, func(c *cursorRow) {
		if c.seq == cursor && c.inflightTo > c.seq {
			c.deliveries = max(c.deliveries-1, c.attempts)
			c.inflightFrom, c.inflightTo, c.inflightSolo = 0, 0, false
		}
	})
}

func (l *fakeLease) Verify(context.Context, string, int64) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.lost {
		return fmt.Errorf("%w: fake", lease.ErrLeaseLost)
	}
	return errors.New("fake: a fenced write changed nothing under a valid lease")
}

// rejects is a RejectHandler that keeps what it was given, once its
// transaction commits; fail makes the next call fail.
type rejects struct {
	mu   sync.Mutex
	got  []RejectedMessage
	fail error
}

func (r *rejects) HandleReject(_ context.Context, tx pgx.Tx, m RejectedMessage) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fail; err != nil {
		r.fail = nil
		return err
	}
	tx.(*fakeTx).do(func() {
		r.mu.Lock()
		r.got = append(r.got, m)
		r.mu.Unlock()
	})
	return nil
}

func (r *rejects) taken() []RejectedMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]RejectedMessage(nil), r.got...)
}

// rig is a worker on the fake store, with its subscription's channel: a
// test answers the messages it hands out with serve, or reads them itself.
type rig struct {
	t       *testing.T
	store   *fakeStore
	lease   *fakeLease
	cfg     *Config
	out     chan *message.Message
	w       *Worker
	stop    context.CancelFunc
	bg      *sync.WaitGroup
	rejects *rejects
}

// tuning is the Tuning of the unit tests: batches of up to 8, backoff
// 100 ms doubling to 1 s.
func tuning() tune.Settings {
	return tune.Default.Settings(8, 100*time.Millisecond, time.Second, tune.Default.PollInterval)
}

// newRig makes a worker of the store's partition with edit applied to its
// Config (the Leased strategy, MaxAttempts 3 with a RejectHandler,
// HandlerTimeout 1 s, by default); batch, when set, makes it a
// ConsumeBatches worker. Call it inside the test's synctest bubble.
func newRig(t *testing.T, s *fakeStore, edit func(*Config, *fakeLease), batch BatchHandler) *rig {
	t.Helper()
	stop, cancel := context.WithCancel(context.Background())
	r := &rig{t: t, store: s, lease: newFakeLease(s), out: make(chan *message.Message), stop: cancel, bg: &sync.WaitGroup{}, rejects: &rejects{}}
	r.cfg = &Config{
		Group: "g", MaxAttempts: 3, HandlerTimeout: time.Second, CloseTimeout: 100 * time.Millisecond,
		Tuning: tuning(), RejectHandler: r.rejects, Store: s, Careful: &Careful{},
		Bulkhead: mustBulkhead(t), Logger: watermill.NopLogger{}, Stop: stop, Background: r.bg, Counts: &Counts{},
		Gate: NewGate(),
	}
	if edit != nil {
		edit(r.cfg, r.lease)
	}
	var out chan<- *message.Message = r.out
	if batch != nil {
		out = nil
	}
	r.w = NewWorker(r.cfg, "orders", "1", r.lease, out, batch)
	t.Cleanup(func() {
		r.w.Stop()
		r.lease.cancel(errors.New("test over"))
		cancel()
		r.bg.Wait()
	})
	return r
}

func mustBulkhead(t *testing.T) *worker.Bulkhead {
	b, err := worker.NewBulkhead(4)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// answer is how serve answers a message: ack, nack, or nothing (it holds
// the message; the worker times out or the lease ends).
type answer func(m *message.Message)

func ack(m *message.Message)  { m.Ack() }
func nack(m *message.Message) { m.Nack() }
func hold(*message.Message)   {}

// step runs one turn of the worker while answering the messages it hands
// out with how (by payload; ack for the others); it returns the turn's
// directive and error, and the messages in the order they were handed out.
func (r *rig) step(how map[string]answer) (worker.Directive, []*message.Message, error) {
	r.t.Helper()
	type result struct {
		dir worker.Directive
		err error
	}
	done := make(chan result, 1)
	go func() {
		dir, err := r.w.Step(r.lease.Context())
		done <- result{dir, err}
	}()
	var got []*message.Message
	for {
		select {
		case res := <-done:
			return res.dir, got, res.err
		case m := <-r.out:
			got = append(got, m)
			a, ok := how[string(m.Payload)]
			if !ok {
				a = ack
			}
			go a(m)
		}
	}
}

// uuids lists the uuids of msgs.
func uuids(msgs []*message.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.UUID
	}
	return out
}
