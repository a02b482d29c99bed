// Package relay runs the log-based mode's relay: it reads the messages that
// Publishers in outbox.ModeWAL wrote into the WAL (pg_logical_emit_message)
// from the schema's logical replication slot, gives each its gap-free seq
// per partition in commit order and appends it to the log, where
// Subscribers, the Forwarder, dead letters, retention, admin and the
// console find it as they find the Sequencer's messages.
//
// One relay streams a slot at a time (PostgreSQL makes the slot exclusive);
// any others wait as standbys and take over when it stops. The position of
// the last transaction appended is written with its messages (table
// relays), so after a crash at any point the next relay numbers every
// message exactly as before, and a relay that finds the position moved
// under it stops instead of appending twice.
//
// A stopped relay makes PostgreSQL keep the WAL from the slot's position
// on: watch Status (RetainedWALBytes), the metric
// outbox_wal_slot_retained_bytes, and set max_slot_wal_keep_size
// (docs/operations.md).
package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/pgrepl"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/internal/startstop"
	"github.com/millrace/watermill-outbox/internal/walrecord"
)

// Defaults of Config.
const (
	DefaultMaxBatch        = 10000
	DefaultStandbyRetry    = time.Second
	DefaultWarnRetainedWAL = 1 << 30 // 1 GiB
	DefaultStatusInterval  = 10 * time.Second
	DefaultTakeoverTimeout = 30 * time.Second
)

// Config configures a Relay.
type Config struct {
	// Schema is the outbox schema (outbox.DefaultSchema when empty). Its
	// slot and publication are named after it (Slot).
	Schema string
	// Pool is the database: the relay appends through it, and opens its
	// replication connection with the pool's connection settings.
	// Required.
	Pool *pgxpool.Pool
	// MaxBatch bounds the messages appended in one transaction (default
	// DefaultMaxBatch). Whole source transactions are appended, so one
	// larger than MaxBatch is appended alone.
	MaxBatch int
	// StandbyRetry is how often a standby tries to take the slot (default
	// DefaultStandbyRetry).
	StandbyRetry time.Duration
	// WarnRetainedWAL: the relay (active or standby) logs an error when the
	// slot keeps more WAL than this many bytes (default
	// DefaultWarnRetainedWAL; negative: never).
	WarnRetainedWAL int64
	// StatusInterval is how often the relay checks the slot's retained WAL
	// (default DefaultStatusInterval).
	StatusInterval time.Duration
	// DisableNotify turns off the notification that wakes Subscribers after
	// each append (they then find messages by polling).
	DisableNotify bool
	// TakeoverTimeout bounds how long a relay that stopped answering (a
	// frozen process or VM, a network partition) keeps the slot and its
	// append from a standby (default DefaultTakeoverTimeout, as a lease's
	// TTL): it is the replication connection's wal_sender_timeout, so the
	// server ends the stream of a relay silent for that long, and the
	// append connection's idle_in_transaction_session_timeout. A relay
	// whose append waits a third of it for a lock held by another relay's
	// append connection ends that session (pg_terminate_backend: the
	// relays run as the same role, or one with pg_signal_backend); the
	// stale append rolls back whole. At least 100 ms; pauses shorter than
	// it are survived without a takeover.
	TakeoverTimeout time.Duration
	// Instance names this relay to the server and to operators: its
	// replication connection's application_name is "watermill-outbox
	// relay " followed by it (pg_stat_activity, pg_stat_replication), so
	// that status (StatusOf's ActiveInstance, outbox status, the console)
	// says which relay streams the slot. Printable ASCII, at most
	// MaxInstanceLen bytes (PostgreSQL keeps 63 bytes of a name). Default:
	// DefaultInstance, the host name and the process id.
	Instance string
}

// MaxInstanceLen is the longest Config.Instance: what PostgreSQL's 63
// bytes of application_name leave after ReplicationNamePrefix.
const MaxInstanceLen = 63 - len(ReplicationNamePrefix)

// ReplicationNamePrefix starts the application_name of every relay's
// replication connection; Config.Instance follows.
const ReplicationNamePrefix = "watermill-outbox relay "

// DefaultInstance is the default Config.Instance: host:pid, the host name
// (with any byte outside printable ASCII as '?') cut to fit MaxInstanceLen.
func DefaultInstance() string { return names.Instance(MaxInstanceLen) }

func (c *Config) setDefaults() {
	if c.Schema == "" {
		c.Schema = names.DefaultSchema
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.StandbyRetry == 0 {
		c.StandbyRetry = DefaultStandbyRetry
	}
	if c.WarnRetainedWAL == 0 {
		c.WarnRetainedWAL = DefaultWarnRetainedWAL
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = DefaultStatusInterval
	}
	if c.TakeoverTimeout == 0 {
		c.TakeoverTimeout = DefaultTakeoverTimeout
	}
	if c.Instance == "" {
		c.Instance = DefaultInstance()
	}
}

// Validate reports the first impossible setting as a *outbox.ConfigError
// (or a *outbox.NameError for a bad schema name).
func (c Config) Validate() error {
	c.setDefaults()
	if err := names.Schema(c.Schema); err != nil {
		return err
	}
	switch {
	case c.Pool == nil:
		return &errs.ConfigError{Field: "Pool", Reason: "required"}
	case c.MaxBatch < 1:
		return &errs.ConfigError{Field: "MaxBatch", Reason: "must be at least 1"}
	case c.StandbyRetry < 0 || c.StatusInterval < 0:
		return &errs.ConfigError{Field: "StandbyRetry, StatusInterval", Reason: "must not be negative"}
	case c.TakeoverTimeout < 100*time.Millisecond:
		return &errs.ConfigError{Field: "TakeoverTimeout", Reason: "must be at least 100ms (or 0 for the default, 30s)"}
	case len(c.Instance) > MaxInstanceLen:
		return &errs.ConfigError{Field: "Instance", Reason: fmt.Sprintf("%d bytes, over %d (PostgreSQL keeps 63 bytes of an application_name, %d of them %q)", len(c.Instance), MaxInstanceLen, len(ReplicationNamePrefix), ReplicationNamePrefix)}
	}
	for _, b := range []byte(c.Instance) {
		if b < 0x20 || b > 0x7e {
			return &errs.ConfigError{Field: "Instance", Reason: fmt.Sprintf("%q has a byte outside printable ASCII, which PostgreSQL would show as '?'", c.Instance)}
		}
	}
	return nil
}

// Slot is the name of schema's replication slot (and publication).
func Slot(schema string) string { return dbsql.WALName(schema) }

// Stats are running totals of a Relay.
type Stats struct {
	Appended     int64 // messages appended to the log
	Transactions int64 // source transactions appended
	Skipped      int64 // records that could not be decoded, logged and skipped
	Active       bool  // this relay streams the slot now (false: standby or stopped)
	// Failures counts the streams and appends that failed and were retried
	// after a backoff (a standby's waiting is not one); LastError says why
	// the last one failed ("" before any). Nothing is appended while they
	// fail: an unregistered partition, say, stops the whole mode.
	Failures  int64
	LastError string
}

// Relay streams a schema's slot into its log. Create it with New, start it
// with Run, stop it with Close. Its lifecycle is every long-running
// component's (internal/startstop): Run once, Close stops it and waits.
type Relay struct {
	cfg    Config
	logger watermill.LoggerAdapter
	q      *dbsql.Queries
	slot   string
	prefix string

	appended, transactions, skipped, failures atomic.Int64
	active                                    atomic.Bool
	lastError                                 atomic.Pointer[string]

	life startstop.Service
}

// New creates a Relay. It does not connect until Run.
func New(cfg Config, logger watermill.LoggerAdapter) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	r := &Relay{
		cfg:    cfg,
		q:      dbsql.For(cfg.Schema),
		slot:   Slot(cfg.Schema),
		prefix: names.WALPrefix(cfg.Schema),
	}
	r.logger = logger.With(watermill.LogFields{"slot": r.slot, "instance": cfg.Instance})
	r.life.Name = "relay.Relay"
	return r, nil
}

// Stats returns the running totals.
func (r *Relay) Stats() Stats {
	if r == nil {
		return Stats{}
	}
	st := Stats{Appended: r.appended.Load(), Transactions: r.transactions.Load(), Skipped: r.skipped.Load(), Active: r.active.Load(), Failures: r.failures.Load()}
	if e := r.lastError.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

// Run relays until ctx is cancelled or Close is called, and returns nil
// then. While another relay streams the slot it waits as a standby.
// Database and connection errors are logged and retried with the shared
// backoff (internal/backoff: 50–100 ms after the first, doubling to
// 2.5–5 s; an append that succeeds resets it). It returns at once the
// errors retrying cannot mend: a schema never migrated or migrated by a
// newer release (found at the start: Run may then be called again), a
// server or role that cannot stream (ErrWALLevel,
// ErrReplicationPrivilege), a missing slot (ErrNoSlot), and a record
// written by a newer release (ErrRecordVersion). Otherwise Run runs once:
// a second Run while it runs is outbox.ErrAlreadyRunning, a Run after
// Close or after Run returned is outbox.ErrClosed.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.made(); err != nil {
		return err
	}
	return r.life.Run(ctx, r.start, r.run)
}

// start refuses a schema retrying would not mend.
func (r *Relay) start(ctx context.Context) error {
	db, _ := pgexec.FromDB(r.cfg.Pool)
	if err := schemacheck.Check(ctx, r.cfg.Pool, db, r.cfg.Schema); errors.Is(err, errs.ErrNotMigrated) || errors.Is(err, errs.ErrSchemaTooNew) {
		return err
	}
	return nil
}

// run is Run's loop, until ctx ends or an error retrying cannot mend.
func (r *Relay) run(ctx context.Context) error {
	r.life.Go(func() { r.watchRetained(ctx) })
	var failures backoff.Streak // backoff.Default
	standby := false
	for {
		appended := r.appended.Load()
		err := r.stream(ctx)
		r.active.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if r.appended.Load() > appended {
			failures.Succeeded() // the stream made progress before it failed
		}
		var wait time.Duration
		switch {
		case isSlotBusy(err):
			if !standby {
				r.logger.Info("Another relay streams the slot; waiting as a standby", nil)
			}
			standby, wait = true, r.cfg.StandbyRetry
			failures.Succeeded()
		case errors.Is(err, ErrWALLevel), errors.Is(err, ErrReplicationPrivilege), errors.Is(err, ErrNoSlot), errors.Is(err, ErrRecordVersion):
			r.logger.Error("Relay stopped", err, nil)
			return err
		default:
			standby = false
			wait = failures.Failed()
			msg := err.Error()
			r.lastError.Store(&msg)
			r.failures.Add(1)
			r.logger.Error("Relay failed, retrying", err, watermill.LogFields{"attempt": failures.Failures(), "retry_in": wait})
		}
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}

// Close stops Run and waits for it to return: for the stream under way to
// end (its connections are closed within 5 s each) and for the
// retained-WAL check to stop. It may be called more than once, before or
// after Run, and always returns nil; a Run after Close returns
// outbox.ErrClosed.
func (r *Relay) Close() error {
	if r.made() != nil {
		return nil // nothing runs
	}
	r.life.Close()
	return nil
}

// made refuses a Relay not made by New (nil, or a zero value), which has no
// Pool to stream with.
func (r *Relay) made() error {
	if r == nil || r.q == nil {
		return fmt.Errorf("%w: a relay.Relay must be made by relay.New", errs.ErrInvalidArgument)
	}
	return nil
}

// txn is one source transaction's messages.
type txn struct {
	commitLSN, endLSN pgrepl.LSN
	commitTime        time.Time
	msgs              []walrecord.Message
}

// stream streams the slot until an error or ctx ends.
func (r *Relay) stream(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	timeout := strconv.FormatInt(r.cfg.TakeoverTimeout.Milliseconds(), 10)
	replCfg := r.cfg.Pool.Config().ConnConfig.Config.Copy()
	if replCfg.RuntimeParams == nil {
		replCfg.RuntimeParams = map[string]string{}
	}
	replCfg.RuntimeParams["wal_sender_timeout"] = timeout
	conn, err := pgrepl.Connect(ctx, replCfg, ReplicationNamePrefix+r.cfg.Instance)
	if err != nil {
		return classify(err)
	}
	defer func() {
		closeCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		_ = conn.Close(closeCtx)
	}()
	if err := conn.StartLogical(ctx, r.slot, r.slot, 0); err != nil {
		return classify(err)
	}
	// The appends go through a connection of their own, named so that the
	// slot's next holder can tell a stale append from anything else, and
	// bounded so that a frozen relay cannot hold the relays row for ever.
	appendCfg := r.cfg.Pool.Config().ConnConfig.Copy()
	if appendCfg.RuntimeParams == nil {
		appendCfg.RuntimeParams = map[string]string{}
	}
	appendCfg.RuntimeParams["application_name"] = r.appendName()
	appendCfg.RuntimeParams["idle_in_transaction_session_timeout"] = timeout
	appendCfg.RuntimeParams["lock_timeout"] = strconv.FormatInt(max(r.cfg.TakeoverTimeout.Milliseconds()/3, 1), 10)
	db, err := pgx.ConnectConfig(ctx, appendCfg)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		_ = db.Close(closeCtx)
	}()
	// The position is read once the slot is this relay's: an append still
	// holding the relays row is then another relay's, and stale.
	pos, err := r.position(ctx, db)
	if err != nil {
		return err
	}
	r.active.Store(true)
	r.logger.Info("Streaming the slot", watermill.LogFields{"position": pgrepl.LSN(pos).String()})

	s := &session{r: r, conn: conn, db: db, startPos: pgrepl.LSN(pos), pos: pgrepl.LSN(pos), txns: make(chan txn, 256)}
	readErr := make(chan error, 1)
	go func() {
		readErr <- s.read(ctx)
		close(s.txns)
	}()
	appendErr := s.appendLoop(ctx)
	cancel()
	rerr := <-readErr
	for range s.txns { // (closed by the reader)
	}
	if appendErr != nil {
		return appendErr
	}
	return rerr
}

// session is one stream of the slot: a reader goroutine decodes whole
// transactions, the appender appends them in batches.
type session struct {
	r    *Relay
	conn *pgrepl.Conn
	// db is the append connection (Relay.appendName).
	db *pgx.Conn
	// startPos is the commit LSN of the last transaction in the log when
	// the session started (the reader skips transactions at or below it);
	// pos the same as the appender moves it.
	startPos, pos pgrepl.LSN
	txns          chan txn

	// inflight counts transactions read and not yet appended; the reader
	// confirms the server's position past idle stretches only when it is 0.
	inflight atomic.Int64
	// confirmed is the highest position that may be confirmed to the server.
	confirmed atomic.Uint64
}

// statusEvery bounds the time between standby status updates while
// messages flow (the server's wal_sender_timeout is 60 s by default).
const statusEvery = 5 * time.Second

func (s *session) read(ctx context.Context) error {
	var cur *txn
	lastStatus := time.Now()
	sent := pgrepl.LSN(0)
	for {
		ev, err := s.conn.Receive(ctx)
		if err != nil {
			return err
		}
		switch {
		case ev.Begin != nil:
			cur = &txn{commitLSN: ev.Begin.FinalLSN, commitTime: ev.Begin.CommitTime}
		case ev.Message != nil:
			m := ev.Message
			if m.Prefix != s.r.prefix {
				continue
			}
			if !m.Transactional || cur == nil {
				s.r.skipped.Add(1)
				s.r.logger.Error("Skipped a non-transactional record with the outbox's prefix (not written by a Publisher)", nil, watermill.LogFields{"lsn": m.LSN.String()})
				continue
			}
			rec, err := walrecord.Decode(m.Content)
			if errors.Is(err, walrecord.ErrVersion) {
				return fmt.Errorf("%w: at %s: %v", ErrRecordVersion, m.LSN, err)
			}
			if err != nil {
				s.r.skipped.Add(1)
				s.r.logger.Error("Skipped a record that cannot be decoded", err, watermill.LogFields{"lsn": m.LSN.String()})
				continue
			}
			cur.msgs = append(cur.msgs, rec)
		case ev.Commit != nil:
			if cur == nil {
				continue
			}
			cur.endLSN = ev.Commit.EndLSN
			t := *cur
			cur = nil
			if len(t.msgs) == 0 || t.commitLSN <= s.startPos {
				// Nothing to append, or appended before a restart.
				if s.inflight.Load() == 0 {
					s.raiseConfirmed(t.endLSN)
				}
				continue
			}
			s.inflight.Add(1)
			select {
			case s.txns <- t:
			case <-ctx.Done():
				return ctx.Err()
			}
		case ev.Keepalive != nil:
			if s.inflight.Load() == 0 && cur == nil {
				s.raiseConfirmed(ev.Keepalive.WALEnd)
			}
			if c := pgrepl.LSN(s.confirmed.Load()); ev.Keepalive.ReplyRequested || c > sent && time.Since(lastStatus) >= statusEvery {
				if err := s.conn.SendStatus(c, false); err != nil {
					return err
				}
				sent, lastStatus = c, time.Now()
			}
		}
	}
}

// neverConfirm (tests only, export_test.go) keeps the slot's confirmed
// position where it is, so that every restart reads again what was
// appended before and must skip it.
var neverConfirm atomic.Bool

func (s *session) raiseConfirmed(l pgrepl.LSN) {
	if neverConfirm.Load() {
		return
	}
	for {
		old := s.confirmed.Load()
		if uint64(l) <= old || s.confirmed.CompareAndSwap(old, uint64(l)) {
			return
		}
	}
}

// appendLoop appends what the reader decoded: it waits for a transaction,
// takes every one already waiting up to MaxBatch messages, and appends them
// in one database transaction.
func (s *session) appendLoop(ctx context.Context) error {
	var batch []txn
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return nil
		case t, ok := <-s.txns:
			if !ok {
				return nil
			}
			batch = append(batch, t)
		}
		n := len(batch[0].msgs)
	more:
		for n < s.r.cfg.MaxBatch {
			select {
			case t, ok := <-s.txns:
				if !ok {
					break more
				}
				batch = append(batch, t)
				n += len(t.msgs)
			default:
				break more
			}
		}
		if err := s.append(ctx, batch, n); err != nil {
			return err
		}
		last := batch[len(batch)-1]
		s.pos = last.commitLSN
		s.raiseConfirmed(last.endLSN)
		s.inflight.Add(-int64(len(batch)))
		if err := s.conn.SendStatus(pgrepl.LSN(s.confirmed.Load()), false); err != nil {
			return err
		}
	}
}

// errFenced: relays.lsn moved under this relay (another one appended).
var errFenced = errors.New("relay: another relay appended since this one started; starting again from its position")

func (s *session) append(ctx context.Context, batch []txn, n int) error {
	started := time.Now()
	type partKey struct {
		topic string
		part  int32
	}
	large := 0
	oldest := map[string]time.Duration{}
	for _, t := range batch {
		for _, m := range t.msgs {
			if len(m.Payload) >= dbsql.LargePayload {
				large++
			}
			if _, ok := oldest[m.Topic]; !ok {
				oldest[m.Topic] = time.Since(t.commitTime)
			}
		}
	}
	var channel *string
	if !s.r.cfg.DisableNotify {
		c := names.SequencedChannel(s.r.cfg.Schema)
		channel = &c
	}
	newPos := batch[len(batch)-1].commitLSN
	if large == 0 && n <= smallAppend {
		if err := s.appendSmall(ctx, batch, n, channel, newPos); err != nil {
			return err
		}
		s.count(batch, n, started, oldest)
		return nil
	}

	counts := map[partKey]int64{}
	var order []partKey
	for _, t := range batch {
		for _, m := range t.msgs {
			k := partKey{m.Topic, m.Partition}
			if counts[k] == 0 {
				order = append(order, k)
			}
			counts[k]++
		}
	}
	topics, parts, ns := make([]string, len(order)), make([]int32, len(order)), make([]int64, len(order))
	for i, k := range order {
		topics[i], parts[i], ns[i] = k.topic, k.part, counts[k]
	}

	tx, err := s.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
	var (
		moved     int64
		gotTopics []string
		gotParts  []int32
		bases     []int64
		notified  *int64
	)
	if err := tx.QueryRow(ctx, s.r.q.WALAdvance, s.r.slot, int64(s.pos), int64(newPos), topics, parts, ns, channel).
		Scan(&moved, &gotTopics, &gotParts, &bases, &notified); err != nil {
		if isLockTimeout(err) {
			return s.r.endStaleAppenders(ctx, err)
		}
		return fmt.Errorf("relay: advance the partitions of %d messages: %w", n, err)
	}
	if moved != 1 {
		return errFenced
	}
	pause("advanced")
	next := make(map[partKey]int64, len(bases))
	for i := range bases {
		next[partKey{gotTopics[i], gotParts[i]}] = bases[i]
	}
	if len(bases) != len(order) {
		var missing []string
		for _, k := range order {
			if _, ok := next[k]; !ok {
				missing = append(missing, fmt.Sprintf("%s partition %d", k.topic, k.part))
			}
		}
		return unregisteredError(n, strings.Join(missing, ", "))
	}
	var bodyIDs []int64
	if large > 0 {
		rows, err := tx.Query(ctx, s.r.q.BodiesNextIDs, large)
		if err != nil {
			return err
		}
		if bodyIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return err
		}
	}
	logRows := make([][]any, 0, n)
	bodyRows := make([][]any, 0, large)
	for _, t := range batch {
		for _, m := range t.msgs {
			k := partKey{m.Topic, m.Partition}
			next[k]++
			var key *string
			if m.Key != "" {
				key = &m.Key
			}
			payload := m.Payload
			var bodyID *int64
			if len(m.Payload) >= dbsql.LargePayload {
				id := bodyIDs[len(bodyRows)]
				bodyRows = append(bodyRows, []any{id, m.Payload})
				payload, bodyID = nil, &id
			} else if payload == nil {
				payload = []byte{}
			}
			logRows = append(logRows, []any{m.Topic, m.Partition, next[k], key, m.UUID, m.Metadata, payload, bodyID, t.commitTime})
		}
	}
	if len(bodyRows) > 0 {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{s.r.cfg.Schema, "bodies"}, []string{"id", "payload"}, pgx.CopyFromRows(bodyRows)); err != nil {
			return fmt.Errorf("relay: copy %d bodies: %w", len(bodyRows), err)
		}
	}
	rows := pgx.CopyFromRows(logRows)
	if testPause.Load() != nil {
		rows = &pausingRows{CopyFromSource: rows, at: len(logRows) / 2}
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{s.r.cfg.Schema, "log"}, logColumns, rows); err != nil {
		return fmt.Errorf("relay: copy %d messages into the log: %w", n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("relay: commit the append of %d messages: %w", n, err)
	}
	s.count(batch, n, started, oldest)
	return nil
}

// count adds an append to the Relay's totals and metrics.
func (s *session) count(batch []txn, n int, started time.Time, oldest map[string]time.Duration) {
	s.r.appended.Add(int64(n))
	s.r.transactions.Add(int64(len(batch)))
	observe.Current().SequencerPass(n, time.Since(started), oldest)
}

// smallAppend is the most messages an append writes with WALAppendSmall,
// one statement and one round trip, instead of a transaction with COPY
// (about five round trips, cheaper per message for large batches). Light
// load appends a transaction or two at a time.
const smallAppend = 64

// appendSmall appends batch (n messages, none of them large) with
// WALAppendSmall.
func (s *session) appendSmall(ctx context.Context, batch []txn, n int, channel *string, newPos pgrepl.LSN) error {
	topics, parts, keys := make([]string, 0, n), make([]int32, 0, n), make([]*string, 0, n)
	uuids, metadata, payloads, times := make([]string, 0, n), make([]string, 0, n), make([][]byte, 0, n), make([]time.Time, 0, n)
	for _, t := range batch {
		for _, m := range t.msgs {
			var key *string
			if m.Key != "" {
				key = &m.Key
			}
			payload := m.Payload
			if payload == nil {
				payload = []byte{}
			}
			topics, parts, keys = append(topics, m.Topic), append(parts, m.Partition), append(keys, key)
			uuids, metadata, payloads, times = append(uuids, m.UUID), append(metadata, m.Metadata), append(payloads, payload), append(times, t.commitTime)
		}
	}
	var moved, appended int64
	var unregistered, notified *int64
	err := s.db.QueryRow(ctx, s.r.q.WALAppendSmall, s.r.slot, int64(s.pos), int64(newPos), topics, parts, keys, uuids, metadata, payloads, times, channel).
		Scan(&moved, &appended, &unregistered, &notified)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
	case isLockTimeout(err):
		return s.r.endStaleAppenders(ctx, err)
	case errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, unregisteredPrefix):
		_, named, _ := strings.Cut(pgErr.Message, unregisteredPrefix)
		named, _, _ = strings.Cut(named, `"`) // the end of the value PostgreSQL quotes
		return unregisteredError(n, named)
	default:
		return fmt.Errorf("relay: append %d messages: %w", n, err)
	}
	if moved != 1 {
		return errFenced
	}
	return nil
}

// unregisteredPrefix starts the text WALAppendSmall fails with (casting it
// to bigint) when a partition is not registered; the partitions follow.
const unregisteredPrefix = "relay: topic partitions not registered: "

// unregisteredError says that partitions (named) of an append of n
// messages are not registered, and that nothing was appended.
func unregisteredError(n int, partitions string) error {
	return fmt.Errorf("relay: topic partitions not registered: %s (was a topic dropped? outbox.RegisterTopic registers it again); none of the append's %d messages was appended, and the relay retries", partitions, n)
}

// appendName is the application_name of the append connections of the
// Relay's slot.
func (r *Relay) appendName() string { return "watermill-outbox relay append " + r.slot }

// isLockTimeout reports SQLSTATE 55P03 (lock_not_available): lock_timeout.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// endStaleAppenders ends the sessions of other relays' append connections
// of the slot after this relay's append waited a third of TakeoverTimeout
// for the relays row: this relay holds the slot, so they are stale (frozen
// or cut off mid-append) and their appends roll back whole. It returns an
// error either way: the stream starts again from the position in the
// relays row.
func (r *Relay) endStaleAppenders(ctx context.Context, waited error) error {
	var ended int64
	if err := r.cfg.Pool.QueryRow(ctx, r.q.WALEndStaleAppenders, r.appendName()).Scan(&ended); err != nil {
		return fmt.Errorf("relay: an append waited for the relays row (%v), and ending the stale append sessions holding it failed (run the relays as the same role, or grant it pg_signal_backend): %w", waited, err)
	}
	r.logger.Error("A relay that stopped answering held the slot's append; its session was ended and its append rolled back", waited, watermill.LogFields{"sessions_ended": ended})
	return fmt.Errorf("relay: an append waited for the relays row: %w (%d stale append sessions ended)", waited, ended)
}

// testPause (tests only, export_test.go) is called at named points of an
// append: "advanced" (the partitions and the position moved, the
// transaction open) and "copy" (halfway through the rows sent by COPY).
var testPause atomic.Pointer[func(point string)]

func pause(point string) {
	if f := testPause.Load(); f != nil {
		(*f)(point)
	}
}

// pausingRows calls pause("copy") before handing out row at.
type pausingRows struct {
	pgx.CopyFromSource
	at, n int
}

func (p *pausingRows) Next() bool {
	if p.n == p.at {
		pause("copy")
	}
	p.n++
	return p.CopyFromSource.Next()
}

// logColumns are the columns the relay copies into the log.
var logColumns = []string{"topic", "partition", "seq", "partition_key", "uuid", "metadata", "payload", "body_id", "created_at"}

// position reads the commit LSN of the last transaction appended,
// creating the relays row if CreateSlot did not.
func (r *Relay) position(ctx context.Context, db *pgx.Conn) (int64, error) {
	if _, err := db.Exec(ctx, r.q.WALRelayInit, r.slot); err != nil {
		if isLockTimeout(err) {
			return 0, r.endStaleAppenders(ctx, err)
		}
		return 0, schemacheck.Wrap(err, r.cfg.Schema)
	}
	var pos int64
	if err := db.QueryRow(ctx, r.q.WALRelayPosition, r.slot).Scan(&pos); err != nil {
		return 0, err
	}
	return pos, nil
}

// watchRetained checks the slot's retained WAL every StatusInterval until
// ctx ends, streaming or not: a standby warns too.
func (r *Relay) watchRetained(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.StatusInterval)
	defer ticker.Stop()
	for {
		r.checkRetained(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// checkRetained logs an error when the slot keeps more WAL than
// WarnRetainedWAL.
func (r *Relay) checkRetained(ctx context.Context) {
	if r.cfg.WarnRetainedWAL < 0 {
		return
	}
	st, err := StatusOf(ctx, r.cfg.Pool, r.cfg.Schema)
	if err != nil || !st.Exists {
		return
	}
	if st.RetainedWALBytes > r.cfg.WarnRetainedWAL {
		r.logger.Error("The replication slot keeps more WAL than WarnRetainedWAL: is a relay running? (see max_slot_wal_keep_size in docs/operations.md)",
			nil, watermill.LogFields{"retained_bytes": st.RetainedWALBytes, "warn_bytes": r.cfg.WarnRetainedWAL, "slot_active": st.Active})
	}
}

// isSlotBusy reports the server's "replication slot is active for PID n".
func isSlotBusy(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55006"
}

// classify turns the server's answers to connecting and streaming into
// the package's typed errors where one applies.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "42704": // undefined_object: the slot
		return fmt.Errorf("%w: %s", ErrNoSlot, pgErr.Message)
	case "42501", "28000": // insufficient_privilege, invalid_authorization_specification
		return fmt.Errorf("%w: %s", ErrReplicationPrivilege, pgErr.Message)
	case "55000": // object_not_in_prerequisite_state: wal_level
		return fmt.Errorf("%w: %s", ErrWALLevel, pgErr.Message)
	}
	return err
}
