// Package relay runs the log-based mode's relay: it reads the messages that
// Publishers in outbox.ModeWAL wrote into the WAL (pg_logical_emit_message)
// from the schema's logical replication slot, gives each its gap-free seq
// per partition in commit order and appends it to the log, where
// Subscribers, the Forwarder, dead letters, retention, admin and the
// console find it as they find the Sequencer's messages. The messages of
// a forwarder-only topic (outbox.ForwardOnly) it puts into pending
// instead, in commit order, where the topic's Forwarder reads them and
// removes them as it records them forwarded: they are never copied into
// the log.
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
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/pgrepl"
	"github.com/millrace/watermill-outbox/internal/relaydriver"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/startstop"
	"github.com/millrace/watermill-outbox/internal/walrecord"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Defaults of Config.
const (
	DefaultMaxBatch        = 10000
	DefaultStandbyRetry    = time.Second
	DefaultWarnRetainedWAL = 1 << 30 // 1 GiB
	DefaultStatusInterval  = 10 * time.Second
	DefaultTakeoverTimeout = 30 * time.Second
	// DefaultMinAppendInterval is the Default tuning profile's sequencer
	// pace (adaptive.Default), so that both publishing modes take a stream
	// of commits in the same size of steps.
	DefaultMinAppendInterval = 20 * time.Millisecond
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
	// MinAppendInterval paces a busy relay (default
	// DefaultMinAppendInterval; negative: no floor), as
	// SequencerConfig.MinPassInterval paces the table mode's sequencer: an
	// append follows the previous one no sooner than a wait that follows
	// the load after it started — 1/20 of MinAppendInterval after an
	// append of one message, growing by 1/40 of it with each further
	// message, never more than MinAppendInterval (Stats.Pace shows it) —
	// and takes every transaction decoded meanwhile (up to MaxBatch), so
	// a stream of small commits is appended, and wakes Subscribers, in
	// steps of everything committed over the wait rather than once per
	// commit, each step costing a read, a cursor move and a send per
	// partition it touches. A commit after an idle stretch is appended at
	// once. Smaller values trade CPU per message for latency under load.
	MinAppendInterval time.Duration
	// StandbyRetry is how often a standby tries to take the slot (default
	// DefaultStandbyRetry).
	StandbyRetry time.Duration
	// WarnRetainedWAL: the relay (active or standby) logs an error when the
	// slot keeps more WAL than this many bytes, checked when Run starts and
	// every StatusInterval (default DefaultWarnRetainedWAL; negative:
	// never).
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
	if c.MinAppendInterval == 0 {
		c.MinAppendInterval = DefaultMinAppendInterval
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

// Validate reports the first impossible setting as a *outboxtype.ConfigError
// (or a *outboxtype.NameError for a bad schema name).
func (c Config) Validate() error {
	c.setDefaults()
	if err := names.Schema(c.Schema); err != nil {
		return err
	}
	switch {
	case c.Pool == nil:
		return &outboxtype.ConfigError{Field: "Pool", Reason: "required"}
	case c.MaxBatch < 1:
		return &outboxtype.ConfigError{Field: "MaxBatch", Reason: "must be at least 1"}
	case c.StandbyRetry < 0 || c.StatusInterval < 0:
		return &outboxtype.ConfigError{Field: "StandbyRetry, StatusInterval", Reason: "must not be negative"}
	case c.TakeoverTimeout < 100*time.Millisecond:
		return &outboxtype.ConfigError{Field: "TakeoverTimeout", Reason: "must be at least 100ms (or 0 for the default, 30s)"}
	case len(c.Instance) > MaxInstanceLen:
		return &outboxtype.ConfigError{Field: "Instance", Reason: fmt.Sprintf("%d bytes, over %d (PostgreSQL keeps 63 bytes of an application_name, %d of them %q)", len(c.Instance), MaxInstanceLen, len(ReplicationNamePrefix), ReplicationNamePrefix)}
	}
	for _, b := range []byte(c.Instance) {
		if b < 0x20 || b > 0x7e {
			return &outboxtype.ConfigError{Field: "Instance", Reason: fmt.Sprintf("%q has a byte outside printable ASCII, which PostgreSQL would show as '?'", c.Instance)}
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
	Appends      int64 // database transactions that appended them (see MinAppendInterval)
	Skipped      int64 // records that could not be decoded, logged and skipped
	Active       bool  // this relay streams the slot now (false: standby or stopped)
	// Failures counts the streams and appends that failed and were retried
	// after a backoff (a standby's waiting is not one); LastError says why
	// the last one failed ("" before any). Nothing is appended while they
	// fail: an unregistered partition, say, stops the whole mode.
	Failures  int64
	LastError string
	// Pace is how soon after the start of the last append the next may
	// start: short at light load, growing with the messages an append
	// carries, up to MinAppendInterval (see MinAppendInterval).
	Pace time.Duration
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

	appended, transactions, appends, skipped, failures atomic.Int64
	pace                                               atomic.Int64 // the load-following gap after the last append (ns)
	active                                             atomic.Bool
	// toldDelayed: the relay said once that delayed messages wait for a
	// sequencer (delay.go).
	toldDelayed atomic.Bool
	lastError   atomic.Pointer[string]

	// backend is PostgreSQL (pgBackend), or the simulator's model.
	backend relaydriver.Backend
	// jitter spreads the backoffs (nil: internal/backoff's).
	jitter func(time.Duration) time.Duration

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
	r.backend = pgBackend{pool: cfg.Pool, q: r.q}
	return r, nil
}

// Stats returns the running totals.
func (r *Relay) Stats() Stats {
	if r == nil {
		return Stats{}
	}
	st := Stats{Appended: r.appended.Load(), Transactions: r.transactions.Load(), Appends: r.appends.Load(), Skipped: r.skipped.Load(), Active: r.active.Load(), Failures: r.failures.Load(),
		Pace: time.Duration(r.pace.Load())}
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
// server or role that cannot stream (outbox.ErrWALLevel,
// ErrReplicationPrivilege), a missing slot (outbox.ErrNoSlot), and a record
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
	if err := schemacheck.Check(ctx, r.cfg.Pool, db, r.cfg.Schema); errors.Is(err, sentinel.ErrNotMigrated) || errors.Is(err, sentinel.ErrSchemaTooNew) {
		return err
	}
	return nil
}

// run is Run's loop, until ctx ends or an error retrying cannot mend.
func (r *Relay) run(ctx context.Context) error {
	if r.cfg.WarnRetainedWAL >= 0 {
		// Once before streaming, which soon lets the slot's WAL go: a
		// relay that starts on a backlog says so every time, not when its
		// watcher happens to look first.
		r.checkRetained(ctx)
		r.life.Go(func() { r.watchRetained(ctx) })
	}
	failures := backoff.Streak{Jitter: r.jitter} // backoff.Default
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
		case errors.Is(err, sentinel.ErrWALLevel), errors.Is(err, ErrReplicationPrivilege), errors.Is(err, sentinel.ErrNoSlot), errors.Is(err, ErrRecordVersion):
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
		return fmt.Errorf("%w: a relay.Relay must be made by relay.New", sentinel.ErrInvalidArgument)
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
	timeout := r.cfg.TakeoverTimeout.Milliseconds()
	conn, err := r.backend.Stream(ctx, r.slot, ReplicationNamePrefix+r.cfg.Instance, timeout)
	if err != nil {
		return classify(err)
	}
	defer func() {
		closeCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		_ = conn.Close(closeCtx)
	}()
	// The appends go through a connection of their own, named so that the
	// slot's next holder can tell a stale append from anything else, and
	// bounded so that a frozen relay cannot hold the relays row for ever.
	db, err := r.backend.Conn(ctx, r.appendName(), max(timeout/3, 1), timeout)
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

// position reads the commit LSN of the last transaction appended,
// creating the relays row if CreateSlot did not.
func (r *Relay) position(ctx context.Context, db relaydriver.Conn) (int64, error) {
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
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		r.checkRetained(ctx)
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
		return fmt.Errorf("%w: %s", sentinel.ErrNoSlot, pgErr.Message)
	case "42501", "28000": // insufficient_privilege, invalid_authorization_specification
		return fmt.Errorf("%w: %s", ErrReplicationPrivilege, pgErr.Message)
	case "55000": // object_not_in_prerequisite_state: wal_level
		return fmt.Errorf("%w: %s", sentinel.ErrWALLevel, pgErr.Message)
	}
	return err
}
