// Package retention keeps the outbox log bounded: a Vacuum deletes the log
// rows every consumer group has finished.
//
// A row of a partition may go once it is at or below the cursor of every
// group on its topic (the minimum over the groups' cursors); a topic that
// no group consumes keeps everything. With KeepFor, consumed rows younger
// than that stay, for replays (admin.ResetCursor). Deletes run in bounded
// chunks, each its own short transaction, and only partitions whose cursors
// moved since the last visit are visited. Each pass also deletes the dead
// letters that were dealt with (replayed or discarded) a while ago
// (Config.DeadLettersKeepFor, a week by default); pending ones stay. And it
// deletes the dedup keys (outbox.DedupKey) whose window is over, which no
// publish would find taken any more.
//
// A group that subscribes later (without StartFromNewest) starts at the
// oldest message still retained, and a cursor reset (package admin) can go
// back only that far.
//
// A group that stops consuming holds retention back for ever: the rows
// after its cursor stay, and the log grows. Every pass reports the groups
// that hold retention back (PassStats.HeldBack: topic, group, partitions,
// how far behind, since when) and Run logs them; a group that does so with
// no live member, and no sign of life for longer than its members' TTL
// (30 s without any member row; counted from the vacuum's start at the
// earliest, so that subscribers starting with it may join), is likely
// abandoned and is logged at warning level.
// admin.DeleteGroup removes it, and the next pass frees what only it kept.
//
// Every entry point refuses a schema that was never migrated
// (outbox.ErrNotMigrated) or was migrated by a newer release
// (outbox.ErrSchemaTooNew).
package retention

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/startstop"
	"github.com/millrace/watermill-outbox/internal/warnlog"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Defaults of Config.
const (
	DefaultInterval          = 10 * time.Second
	DefaultChunkSize         = 5000
	DefaultMaxChunksPerVisit = 20
	// DefaultDeadLettersKeepFor is the default Config.DeadLettersKeepFor:
	// a week to look back at what was replayed or discarded.
	DefaultDeadLettersKeepFor = 7 * 24 * time.Hour
	// Forever, as Config.DeadLettersKeepFor, keeps every dead letter.
	Forever time.Duration = -1
)

// Config configures a Vacuum.
type Config struct {
	// Schema is the outbox schema (default "watermill_outbox").
	Schema string
	// Pool is the connection pool. Required.
	Pool *pgxpool.Pool
	// Interval is the pause between passes when the last pass finished its
	// work (default DefaultInterval). A pass that left work (a partition
	// hit MaxChunksPerVisit) is followed by the next one at once; a pass
	// that failed by the next one after the shared backoff (50–100 ms after
	// the first failure, doubling to 2.5–5 s).
	Interval time.Duration
	// ChunkSize bounds the rows one DELETE removes (default
	// DefaultChunkSize).
	ChunkSize int
	// MaxChunksPerVisit bounds the DELETEs per partition per pass (default
	// DefaultMaxChunksPerVisit), so that a partition with a large backlog
	// does not hold up the others.
	MaxChunksPerVisit int
	// KeepFor keeps consumed rows until they are this old (by the
	// sequencer's clock, log.sequenced_at), so that a group can be reset
	// back that far. 0 deletes them as soon as every group is past them.
	KeepFor time.Duration
	// DeadLettersKeepFor deletes the dead letters that were dealt with
	// (replayed or discarded, package deadletter) once their last change
	// is this old, at most ChunkSize per pass, so that the table does not
	// grow for ever; pending ones are never deleted. Default
	// DefaultDeadLettersKeepFor; Forever keeps them all.
	DeadLettersKeepFor time.Duration
}

func (c *Config) setDefaults() {
	if c.Schema == "" {
		c.Schema = names.DefaultSchema
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.MaxChunksPerVisit == 0 {
		c.MaxChunksPerVisit = DefaultMaxChunksPerVisit
	}
	if c.DeadLettersKeepFor == 0 {
		c.DeadLettersKeepFor = DefaultDeadLettersKeepFor
	}
}

// Validate reports the first impossible setting as a *outboxtype.ConfigError,
// or a *outboxtype.NameError for a bad schema name.
func (c Config) Validate() error {
	c.setDefaults()
	if err := names.Schema(c.Schema); err != nil {
		return err
	}
	switch {
	case c.Pool == nil:
		return &outboxtype.ConfigError{Field: "Pool", Reason: "required"}
	case c.Interval < 0:
		return &outboxtype.ConfigError{Field: "Interval", Reason: fmt.Sprintf("must be positive, got %v", c.Interval)}
	case c.ChunkSize < 1:
		return &outboxtype.ConfigError{Field: "ChunkSize", Reason: fmt.Sprintf("must be at least 1, got %d", c.ChunkSize)}
	case c.MaxChunksPerVisit < 1:
		return &outboxtype.ConfigError{Field: "MaxChunksPerVisit", Reason: fmt.Sprintf("must be at least 1, got %d", c.MaxChunksPerVisit)}
	case c.KeepFor < 0:
		return &outboxtype.ConfigError{Field: "KeepFor", Reason: fmt.Sprintf("must not be negative, got %v", c.KeepFor)}
	case c.DeadLettersKeepFor < 0 && c.DeadLettersKeepFor != Forever:
		return &outboxtype.ConfigError{Field: "DeadLettersKeepFor", Reason: fmt.Sprintf("must be positive, or retention.Forever to keep every dead letter; got %v", c.DeadLettersKeepFor)}
	}
	return nil
}

// PassStats describes one pass of a Vacuum.
type PassStats struct {
	// Partitions is how many partitions had cursors; Visited how many of
	// them the pass worked on (their cursors had moved, or work was left).
	Partitions int `json:"partitions"`
	Visited    int `json:"visited"`
	// Deleted is how many log rows the pass deleted.
	Deleted int64 `json:"deleted"`
	// More reports work left for the next pass (a partition hit
	// MaxChunksPerVisit, or ChunkSize dead letters were deleted).
	More bool `json:"more"`
	// DeadLetters is how many dead letters dealt with long enough ago
	// (Config.DeadLettersKeepFor) the pass deleted.
	DeadLetters int64 `json:"dead_letters"`
	// DedupKeys is how many dedup keys whose window was over the pass
	// deleted: at most MaxChunksPerVisit chunks of ChunkSize (More is set
	// when it deleted that many).
	DedupKeys int64 `json:"dedup_keys"`
	// HeldBack lists the groups that hold retention back, as the pass
	// left them: per topic, every group whose cursor is the lowest of all
	// groups in a partition with messages left after it, the one keeping
	// the most messages first. A group without live members is likely
	// abandoned: delete it (admin.DeleteGroup) to free the log.
	HeldBack []Holder `json:"held_back,omitempty"`
}

// Holder is a consumer group that holds retention back on a topic: in
// Partitions, its cursor is the lowest of all groups and messages are left
// after it, so the vacuum keeps them until it moves.
type Holder struct {
	Topic string `json:"topic"`
	Group string `json:"group"`
	// Partitions are the partitions it holds back, sorted.
	Partitions []int `json:"partitions"`
	// Messages is how far behind it is: the messages between its cursors
	// and the heads of those partitions. The vacuum keeps at least these;
	// were the group gone, it could delete those the next lowest group has
	// finished.
	Messages int64 `json:"messages"`
	// OldestAt is when the oldest message it has not finished there was
	// sequenced: how far behind it is in time.
	OldestAt time.Time `json:"oldest_at"`
	// LastActivity is when one of its cursor rows in those partitions last
	// changed (a cursor move, a recorded failure, a pause or reset): how
	// long it has stood there.
	LastActivity time.Time `json:"last_activity"`
	// LiveMembers counts its live members on the topic (a heartbeat within
	// the member's lease TTL); 0 means nobody consumes for it, so it will
	// not move by itself.
	LiveMembers int `json:"live_members"`
}

// Stats are running totals of a Vacuum.
type Stats struct {
	Passes      int64 // passes run
	Visits      int64 // partition visits
	Deleted     int64 // log rows deleted
	DeadLetters int64 // dead letters deleted (Config.DeadLettersKeepFor)
	DedupKeys   int64 // expired dedup keys deleted
}

type partitionKey struct {
	topic     string
	partition int32
}

// partitionState is what the vacuum knows about a partition from its last
// visit.
type partitionState struct {
	// done: every row at or below it is deleted (or was never there).
	done int64
	// With KeepFor: the horizon of the visit that left young rows, and
	// when (database clock) the oldest of them becomes deletable.
	keptHorizon int64
	retryAt     time.Time
}

// Vacuum deletes consumed log rows. Create it with NewVacuum, run it with
// Run (one per instance is fine: concurrent vacuums never delete a row
// that is still needed), stop it with Close. Its lifecycle is every
// long-running component's (internal/startstop): Run once, Close stops it
// and waits.
type Vacuum struct {
	cfg    Config
	logger watermill.LoggerAdapter

	baseLogger watermill.LoggerAdapter // as given, for Warn
	logFields  watermill.LogFields     // the component's fields

	q *dbsql.Queries // the statements, for cfg.Schema
	// When each abandoned holder (topic, group) was last warned about.
	warnedHolders map[string]time.Time
	// started is when NewVacuum made it: the subscribers started with it
	// are given their join grace from then (gone).
	started time.Time

	passMu sync.Mutex // one pass at a time
	state  map[partitionKey]*partitionState

	passes, visits, deleted, deadLetters, dedupKeys atomic.Int64

	life startstop.Service
}

// NewVacuum creates a Vacuum. It does nothing until Run or VacuumOnce.
func NewVacuum(cfg Config, logger watermill.LoggerAdapter) (*Vacuum, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	fields := watermill.LogFields{"component": "outbox.retention", "schema": cfg.Schema}
	v := &Vacuum{
		cfg:        cfg,
		logger:     logger.With(fields),
		baseLogger: logger,
		logFields:  fields,
		state:      map[partitionKey]*partitionState{},

		warnedHolders: map[string]time.Time{},
		started:       time.Now(),
		q:             dbsql.For(cfg.Schema),
	}
	v.life.Name = "retention.Vacuum"
	return v, nil
}

// Stats returns the running totals.
func (v *Vacuum) Stats() Stats {
	return Stats{Passes: v.passes.Load(), Visits: v.visits.Load(), Deleted: v.deleted.Load(), DeadLetters: v.deadLetters.Load(), DedupKeys: v.dedupKeys.Load()}
}

// Run vacuums until ctx ends or Close is called, then returns nil. A
// schema it cannot work with ends it at once: one never migrated
// (outbox.ErrNotMigrated: run outbox.Migrate first, then Run again) or
// migrated by a newer release (outbox.ErrSchemaTooNew). Other database
// errors are logged and the pass retried with the shared backoff
// (internal/backoff: 50–100 ms after the first failure, doubling to
// 2.5–5 s). Otherwise Run runs once: a second Run while it runs is
// outbox.ErrAlreadyRunning, a Run after Close or after Run returned is
// outbox.ErrClosed.
//
// Each pass is logged at Debug level with the groups that hold retention
// back (PassStats.HeldBack); a group that does so without live members is
// logged at warning level (see WarnLogger) when first seen and every hour
// while it lasts.
func (v *Vacuum) Run(ctx context.Context) error {
	if v.q == nil {
		return errs.NotConstructed("retention.Vacuum", "retention.NewVacuum")
	}
	return v.life.Run(ctx, v.start, v.run)
}

// start refuses a schema retrying would not mend; any other error (the
// database not up yet, say) is met again by the first pass, and retried.
func (v *Vacuum) start(ctx context.Context) error {
	if err := schemacheck.CheckPool(ctx, v.cfg.Pool, v.cfg.Schema); errors.Is(err, sentinel.ErrNotMigrated) || errors.Is(err, sentinel.ErrSchemaTooNew) {
		return fmt.Errorf("retention: %w", err)
	}
	return nil
}

// run is Run's loop, until ctx ends.
func (v *Vacuum) run(ctx context.Context) error {
	var failures backoff.Streak // backoff.Default
	for {
		stats, err := v.VacuumOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var wait time.Duration
		switch {
		case err != nil:
			wait = failures.Failed()
			v.logger.Error("Vacuum pass failed, retrying", err, watermill.LogFields{"attempt": failures.Failures(), "retry_in": wait})
		case stats.More:
			failures.Succeeded()
		default:
			failures.Succeeded()
			wait = v.cfg.Interval
		}
		if err == nil {
			v.logger.Debug("Vacuum pass", watermill.LogFields{"visited": stats.Visited, "deleted": stats.Deleted, "dead_letters": stats.DeadLetters,
				"dedup_keys": stats.DedupKeys, "more": stats.More,
				"held_back": heldBackSummary(stats.HeldBack)})
		}
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}

// Close stops Run and waits for it to return: for the pass under way to
// see its context cancelled. It may be called more than once, before or
// after Run, and always returns nil; a Run after Close returns
// outbox.ErrClosed.
func (v *Vacuum) Close() error {
	v.life.Close()
	return nil
}

// VacuumOnce runs one pass: it reads every partition's horizon and deletes,
// in partitions whose horizon moved since their last visit (or that have
// work left), the rows at or below it, in chunks, deletes the old dead
// letters dealt with and the expired dedup keys, then reads who holds
// retention back (PassStats.HeldBack) and warns about abandoned holders
// (see Run). It returns what it did; on an error, the work done so far
// stays done. A schema never migrated is outbox.ErrNotMigrated, one
// migrated by a newer release outbox.ErrSchemaTooNew.
func (v *Vacuum) VacuumOnce(ctx context.Context) (PassStats, error) {
	if v.q == nil {
		return PassStats{}, errs.NotConstructed("retention.Vacuum", "retention.NewVacuum")
	}
	v.passMu.Lock()
	defer v.passMu.Unlock()
	v.passes.Add(1)
	stats, err := v.pass(ctx)
	// A schema dropped since the cached check: 42P01, from any statement.
	return stats, schemacheck.Wrap(err, v.cfg.Schema)
}

func (v *Vacuum) pass(ctx context.Context) (PassStats, error) {

	type horizon struct {
		key  partitionKey
		seq  int64
		dbAt time.Time
	}
	if err := schemacheck.CheckPool(ctx, v.cfg.Pool, v.cfg.Schema); err != nil {
		return PassStats{}, err
	}
	rows, err := v.cfg.Pool.Query(ctx, v.q.CursorsHorizon)
	if err != nil {
		return PassStats{}, fmt.Errorf("retention: read cursors: %w", err)
	}
	var hs []horizon
	for rows.Next() {
		var h horizon
		if err := rows.Scan(&h.key.topic, &h.key.partition, &h.seq, &h.dbAt); err != nil {
			rows.Close()
			return PassStats{}, fmt.Errorf("retention: read cursors: %w", err)
		}
		hs = append(hs, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return PassStats{}, fmt.Errorf("retention: read cursors: %w", err)
	}

	stats := PassStats{Partitions: len(hs)}
	for _, h := range hs {
		st := v.state[h.key]
		if st == nil {
			st = &partitionState{}
			v.state[h.key] = st
		}
		if h.seq <= st.done {
			continue // nothing consumed since the last visit
		}
		if !st.retryAt.IsZero() && h.seq == st.keptHorizon && h.dbAt.Before(st.retryAt) {
			continue // only rows KeepFor still keeps
		}
		stats.Visited++
		v.visits.Add(1)
		n, more, err := v.visit(ctx, h.key, h.seq, h.dbAt, st)
		stats.Deleted += n
		v.deleted.Add(n)
		if err != nil {
			return stats, err
		}
		stats.More = stats.More || more
	}
	if v.cfg.DeadLettersKeepFor != Forever {
		var n int64
		if err := v.cfg.Pool.QueryRow(ctx, v.q.DeadLettersPurgeResolved, v.cfg.DeadLettersKeepFor.Microseconds(), v.cfg.ChunkSize).Scan(&n); err != nil {
			return stats, fmt.Errorf("retention: delete old dead letters: %w", err)
		}
		stats.DeadLetters = n
		v.deadLetters.Add(n)
		stats.More = stats.More || n == int64(v.cfg.ChunkSize)
	}
	n, more, err := v.purgeDedupKeys(ctx)
	stats.DedupKeys = n
	v.dedupKeys.Add(n)
	if err != nil {
		return stats, err
	}
	stats.More = stats.More || more
	holders, err := v.holders(ctx)
	if err != nil {
		return stats, err
	}
	stats.HeldBack = holders
	return stats, nil
}

// holders reads who holds retention back, and warns about each group that
// does so without live members (likely abandoned): when it is first seen,
// and again every rewarnInterval while it lasts.
func (v *Vacuum) holders(ctx context.Context) ([]Holder, error) {
	rows, err := v.cfg.Pool.Query(ctx, v.q.CursorsRetentionHolders)
	if err != nil {
		return nil, fmt.Errorf("retention: read holders: %w", err)
	}
	defer rows.Close()
	var (
		out        []Holder
		heartbeats []*time.Time     // the newest heartbeat of each holder's members, live or not
		ttls       []*time.Duration // their longest TTL
	)
	for rows.Next() {
		var (
			h         Holder
			parts     []int32
			heartbeat *time.Time
			ttl       *time.Duration
		)
		if err := rows.Scan(&h.Topic, &h.Group, &parts, &h.Messages, &h.OldestAt, &h.LastActivity, &h.LiveMembers, &heartbeat, &ttl); err != nil {
			return nil, fmt.Errorf("retention: read holders: %w", err)
		}
		h.Partitions = make([]int, len(parts))
		for i, p := range parts {
			h.Partitions[i] = int(p)
		}
		out = append(out, h)
		heartbeats, ttls = append(heartbeats, heartbeat), append(ttls, ttl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("retention: read holders: %w", err)
	}
	now := time.Now()
	warned := map[string]time.Time{}
	for i, h := range out {
		if h.LiveMembers > 0 || !v.gone(now, h, heartbeats[i], ttls[i]) {
			continue
		}
		key := h.Topic + "\x00" + h.Group
		last, ok := v.warnedHolders[key]
		if ok && now.Sub(last) < rewarnInterval {
			warned[key] = last
			continue
		}
		warned[key] = now
		v.warn("A consumer group without live members holds retention back: the log keeps every message it has not finished "+
			"until it moves. If the group is abandoned, delete it (admin.DeleteGroup); otherwise restart its subscribers",
			watermill.LogFields{"topic": h.Topic, "group": h.Group, "partitions": h.Partitions, "messages_behind": h.Messages,
				"oldest_at": h.OldestAt, "last_activity": h.LastActivity, "idle_for": now.Sub(h.LastActivity).Round(time.Second).String()})
	}
	v.warnedHolders = warned
	return out, nil
}

// joinGrace is how long a group without live members may still be joining
// when none of its members ever heartbeated: the lease's default member
// TTL (a member's row says its own).
const joinGrace = 30 * time.Second

// gone reports whether holder h, with no live members, has shown no sign
// of life for longer than a member may take to join: its grace is the
// longest TTL of its members (joinGrace without any), and its last sign
// of life the latest of its last cursor change, its newest heartbeat and
// this vacuum's start (subscribers started with it are joining too). A
// group whose subscribers are starting touches its cursors and writes its
// member rows within that time, so it is not called abandoned meanwhile.
func (v *Vacuum) gone(now time.Time, h Holder, heartbeat *time.Time, ttl *time.Duration) bool {
	grace := joinGrace
	if ttl != nil && *ttl > 0 {
		grace = *ttl
	}
	last := h.LastActivity
	if heartbeat != nil && heartbeat.After(last) {
		last = *heartbeat
	}
	if v.started.After(last) {
		last = v.started
	}
	return now.Sub(last) >= grace
}

// heldBackSummary describes holders for a log line: "topic/group: N
// messages behind in partitions [...], M live members" each.
func heldBackSummary(hs []Holder) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = fmt.Sprintf("%s/%s: %d messages behind in partitions %v, %d live members, last activity %s",
			h.Topic, h.Group, h.Messages, h.Partitions, h.LiveMembers, h.LastActivity.Format(time.RFC3339))
	}
	return out
}

// rewarnInterval is how often the warning about a group that holds
// retention back without live members is repeated while it lasts.
const rewarnInterval = time.Hour

// warn logs at warning level: through the component logger if it has Warn,
// else through the logger NewVacuum was given (with the component's
// fields), else at Error level.
func (v *Vacuum) warn(msg string, fields watermill.LogFields) {
	if _, ok := v.logger.(warnlog.Logger); ok {
		warnlog.Warn(msg, fields, v.logger)
		return
	}
	warnlog.Warn(msg, v.logFields.Add(fields), v.baseLogger, v.logger)
}

// visit deletes the rows of one partition at or below horizon, at most
// MaxChunksPerVisit chunks, and updates st.
func (v *Vacuum) visit(ctx context.Context, key partitionKey, horizon int64, dbNow time.Time, st *partitionState) (deleted int64, more bool, err error) {
	var cutoff any
	if v.cfg.KeepFor > 0 {
		cutoff = dbNow.Add(-v.cfg.KeepFor)
	}
	for chunk := 0; chunk < v.cfg.MaxChunksPerVisit; chunk++ {
		var n, maxSeq int64
		err := v.cfg.Pool.QueryRow(ctx, v.q.LogTrim, key.topic, key.partition, horizon, v.cfg.ChunkSize, cutoff).Scan(&n, &maxSeq)
		if err != nil {
			return deleted, false, fmt.Errorf("retention: delete from %s/%d: %w", key.topic, key.partition, err)
		}
		deleted += n
		if n > 0 {
			observe.Current().RetentionDeleted(key.topic, n)
		}
		if n < int64(v.cfg.ChunkSize) {
			return deleted, false, v.finish(ctx, key, horizon, st)
		}
	}
	return deleted, true, nil
}

// finish records a partition's state after its rows at or below horizon
// are deleted, except those KeepFor keeps.
func (v *Vacuum) finish(ctx context.Context, key partitionKey, horizon int64, st *partitionState) error {
	st.retryAt, st.keptHorizon = time.Time{}, 0
	if v.cfg.KeepFor == 0 {
		st.done = horizon
		return nil
	}
	var (
		seq int64
		at  time.Time
	)
	err := v.cfg.Pool.QueryRow(ctx, v.q.LogOldestKept, key.topic, key.partition, horizon).Scan(&seq, &at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		st.done = horizon
		return nil
	case err != nil:
		return fmt.Errorf("retention: read %s/%d: %w", key.topic, key.partition, err)
	}
	st.done = seq - 1
	st.keptHorizon, st.retryAt = horizon, at.Add(v.cfg.KeepFor)
	return nil
}
