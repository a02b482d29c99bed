// Package admin operates consumer groups of the outbox: pause and resume
// partitions or whole groups, reset a group's cursor to a seq or a point in
// time, delete an abandoned group, and report the status of every topic,
// group and partition (head, cursor, lag, lease, adaptive state, failures,
// backoff, dead letters, live members, who holds retention back).
//
// Everything works through the database, so it can run in any process: a
// CLI, an HTTP admin endpoint, a test. The running subscribers pick the
// changes up by themselves: a paused partition's lease is given back within
// the lease manager's balance interval (1s by default), and a reset revokes
// the partition's lease, so the worker that held it stops and the next
// holder starts from the new cursor.
package admin

import (
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/partitioning"

	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// Errors of the admin operations besides the outbox's own, each matched
// with errors.Is. Nothing matching the scope (an unknown group, topic or
// partition, a group that never subscribed to the topic, Status asked for
// an unknown group or topic) is outbox.ErrNotFound (a *NotFoundError says
// which); an impossible scope or position is outbox.ErrInvalidArgument.
var (
	// ErrSeqOutOfRange: a reset to a seq beyond a partition's head
	// (*SeqRangeError).
	ErrSeqOutOfRange = errors.New("admin: seq out of range")
	// ErrGroupActive: DeleteGroup was refused because the group has live
	// members or leases (*GroupActiveError).
	ErrGroupActive = errors.New("admin: consumer group is active")
)

// GroupActiveError reports a group DeleteGroup refused to delete because
// it is in use.
type GroupActiveError struct {
	Group string
	// Topic is the topic the deletion was limited to ("": all).
	Topic string
	// Members are the live members: those whose last heartbeat is within
	// their lease TTL, and the owners of unexpired leases, sorted.
	Members []string
	// LeasedPartitions counts partitions with an unexpired lease.
	LeasedPartitions int
}

func (e *GroupActiveError) Error() string {
	return fmt.Sprintf("admin: consumer group %q%s is in use: %d live member(s) %v, %d partition(s) with an unexpired lease. "+
		"Stop its subscribers first (a member that crashed stops counting one lease TTL after its last heartbeat, once its leases expired), "+
		"or delete it anyway with DeleteGroupOptions.Force",
		e.Group, topicSuffix(e.Topic), len(e.Members), e.Members, e.LeasedPartitions)
}

// Is makes errors.Is(err, ErrGroupActive) true.
func (e *GroupActiveError) Is(target error) bool { return target == ErrGroupActive }

// SeqRangeError reports a reset to a seq the partition does not have yet.
type SeqRangeError struct {
	Topic     string
	Partition int
	Seq       int64 // requested
	Head      int64 // the partition's last seq
}

func (e *SeqRangeError) Error() string {
	return fmt.Sprintf("admin: cannot reset %s/%d to seq %d: its head is %d", e.Topic, e.Partition, e.Seq, e.Head)
}

// Is makes errors.Is(err, ErrSeqOutOfRange) true.
func (e *SeqRangeError) Is(target error) bool { return target == ErrSeqOutOfRange }

// Config configures an Admin.
type Config struct {
	// Schema is the outbox schema (default "watermill_outbox").
	Schema string
	// Pool is the connection pool. Required.
	Pool *pgxpool.Pool
}

func (c *Config) setDefaults() {
	if c.Schema == "" {
		c.Schema = names.DefaultSchema
	}
}

// Validate reports the first impossible setting as a *outboxtype.ConfigError,
// or a *outboxtype.NameError for a bad schema name.
func (c Config) Validate() error {
	c.setDefaults()
	if err := names.Schema(c.Schema); err != nil {
		return err
	}
	if c.Pool == nil {
		return &outboxtype.ConfigError{Field: "Pool", Reason: "required"}
	}
	return nil
}

// check refuses a schema that was never migrated (outbox.ErrNotMigrated)
// or was migrated by a newer release (outbox.ErrSchemaTooNew); one query
// per pool and schema.
func (a *Admin) check(ctx context.Context) error {
	if err := a.constructed(); err != nil {
		return err
	}
	return schemacheck.CheckPool(ctx, a.cfg.Pool, a.cfg.Schema)
}

// Admin runs the admin operations. It holds no resources of its own and is
// safe for concurrent use.
type Admin struct {
	cfg    Config
	logger watermill.LoggerAdapter
	q      *dbsql.Queries // the statements, for cfg.Schema
}

// New creates an Admin.
func New(cfg Config, logger watermill.LoggerAdapter) (*Admin, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Admin{
		cfg:    cfg,
		logger: logger.With(watermill.LogFields{"component": "outbox.admin", "schema": cfg.Schema}),
		q:      dbsql.For(cfg.Schema),
	}, nil
}

// Scope selects cursors: a consumer group's, on one topic or on all its
// topics, in some partitions or all of them.
type Scope struct {
	// Group is the consumer group. Required.
	Group string `json:"group"`
	// Topic limits the scope to one topic ("": every topic the group
	// consumes; not allowed for ResetCursor).
	Topic string `json:"topic,omitempty"`
	// Partitions limits the scope to these partitions of Topic (none: all).
	Partitions []int `json:"partitions,omitempty"`
}

func (s Scope) validate() error {
	switch {
	case s.Group == "":
		return fmt.Errorf("%w: Scope.Group is required", sentinel.ErrInvalidArgument)
	case s.Topic == "" && len(s.Partitions) > 0:
		return fmt.Errorf("%w: Scope.Partitions needs Scope.Topic", sentinel.ErrInvalidArgument)
	}
	if s.Topic != "" {
		if err := names.Topic(s.Topic); err != nil {
			return err
		}
	}
	for _, p := range s.Partitions {
		if p < 0 || p >= partitioning.MaxPartitions {
			return fmt.Errorf("%w: partition %d", sentinel.ErrInvalidArgument, p)
		}
	}
	return nil
}

func (s Scope) partitions() []int32 {
	out := make([]int32, len(s.Partitions))
	for i, p := range s.Partitions {
		out[i] = int32(p)
	}
	return out
}

// Pause pauses the scope's partitions: the group's members stop acquiring
// them and give back the leases they hold within their balance interval
// (after the message in flight). It returns how many partitions the scope
// covers; a scope naming an unknown topic or group, or partitions the group
// has no cursor in, is a *NotFoundError (outbox.ErrNotFound) and changes
// nothing.
func (a *Admin) Pause(ctx context.Context, s Scope) (n int, err error) {
	ctx, span := startSpan(ctx, "pause", s.Group, s.Topic)
	defer func() { span.EndWith(err, changed(n)) }()
	return a.setPaused(ctx, s, true)
}

// Resume resumes the scope's partitions; the group goes on from its cursors.
// A partition that was backing off after a failure retries at once: pause
// and resume is an operator's "retry now". It returns how many partitions
// the scope covers (a *NotFoundError as for Pause).
func (a *Admin) Resume(ctx context.Context, s Scope) (n int, err error) {
	ctx, span := startSpan(ctx, "resume", s.Group, s.Topic)
	defer func() { span.EndWith(err, changed(n)) }()
	return a.setPaused(ctx, s, false)
}

func (a *Admin) setPaused(ctx context.Context, s Scope, paused bool) (int, error) {
	if err := s.validate(); err != nil {
		return 0, err
	}
	if err := a.check(ctx); err != nil {
		return 0, err
	}
	// One transaction: a scope naming a partition the group has no cursor
	// in changes none of the others either.
	var n int
	err := pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, a.q.CursorsPause, s.Group, s.Topic, s.partitions(), paused)
		if err != nil {
			return fmt.Errorf("admin: pause/resume %+v: %w", s, err)
		}
		n = int(tag.RowsAffected())
		if err := s.complete(n); err != nil {
			return err
		}
		return a.announce(ctx, tx, s)
	})
	if err != nil {
		return 0, a.explain(ctx, s, schemaErr(err, a.cfg.Schema))
	}
	op := "Resumed"
	if paused {
		op = "Paused"
	}
	a.logger.Info(op+" partitions", watermill.LogFields{"group": s.Group, "topic": s.Topic, "partitions": s.Partitions, "count": n})
	return n, nil
}

// complete reports outbox.ErrNotFound when the scope matched no cursor, or
// fewer than the partitions it names.
func (s Scope) complete(n int) error {
	want := len(slices.Compact(slices.Sorted(slices.Values(s.Partitions))))
	if n == 0 || want > 0 && n < want {
		return fmt.Errorf("%w: group %q, topic %q, partitions %v (found %d)", sentinel.ErrNotFound, s.Group, s.Topic, s.Partitions, n)
	}
	return nil
}

// Position is where ResetCursor puts a cursor: ToSeq or ToTime. The zero
// Position is no position (outbox.ErrInvalidArgument), so that a forgotten
// one can never rewind a group to its start.
type Position struct {
	seq    int64
	at     time.Time
	isTime bool
	set    bool
}

// ToSeq is the position after the message at seq (0: before the first):
// the group's next message is seq+1.
func ToSeq(seq int64) Position { return Position{seq: seq, set: true} }

// ToTime is the position before the first message sequenced at or after t
// (log.sequenced_at), in each partition: the group gets again every
// message from t on (as far as the log still holds them). A time after the
// last message puts the cursor at the partition's head.
func ToTime(t time.Time) Position { return Position{at: t, isTime: true, set: true} }

// CursorReset describes one cursor moved by ResetCursor.
type CursorReset struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
}

// ResetCursor moves the scope's cursors (Scope.Topic is required) to pos,
// backwards (replay) or forwards (skip), in one transaction. The same
// statement revokes each partition's lease (no owner, token + 1), so the
// worker holding it stops at its next renewal or cursor write, which fails,
// and the next holder reads the new cursor. The failure count and last error
// are cleared. A seq beyond a partition's head is refused
// (*SeqRangeError), and an unknown topic, group or partition
// (*NotFoundError), and nothing changes.
//
// Messages the retention vacuum already deleted cannot be replayed: the
// group goes on from the oldest one left. A forwarder-only topic
// (outbox.ForwardOnly) has no log: its cursors are refused
// (outbox.ErrInvalidArgument).
func (a *Admin) ResetCursor(ctx context.Context, s Scope, pos Position) (resets []CursorReset, err error) {
	ctx, span := startSpan(ctx, "reset cursor", s.Group, s.Topic)
	defer func() { span.EndWith(err, changed(len(resets))) }()
	return a.resetCursor(ctx, s, pos)
}

func (a *Admin) resetCursor(ctx context.Context, s Scope, pos Position) ([]CursorReset, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if s.Topic == "" {
		return nil, fmt.Errorf("%w: ResetCursor needs Scope.Topic", sentinel.ErrInvalidArgument)
	}
	if !pos.set {
		return nil, fmt.Errorf("%w: the zero Position: use admin.ToSeq or admin.ToTime", sentinel.ErrInvalidArgument)
	}
	if err := a.check(ctx); err != nil {
		return nil, err
	}
	if !pos.isTime && pos.seq < 0 {
		return nil, fmt.Errorf("%w: seq %d is negative", sentinel.ErrInvalidArgument, pos.seq)
	}
	if pos.isTime && pos.at.IsZero() {
		return nil, fmt.Errorf("%w: zero time", sentinel.ErrInvalidArgument)
	}
	var resets []CursorReset
	err := pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		var partitions int
		var forwardOnly bool
		err := tx.QueryRow(ctx, a.q.TopicsForwardOnly, s.Topic).Scan(&partitions, &forwardOnly)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("admin: reset: read cursors: %w", err)
		}
		if forwardOnly {
			return fmt.Errorf("%w: topic %q is forwarder-only (outbox.ForwardOnly): it keeps no log to replay or skip, and its cursors stand where the broker's records end (its forwarder puts them back there at its next takeover)", sentinel.ErrInvalidArgument, s.Topic)
		}
		// Lock the cursors and read each partition's head; with a time, also
		// the seq before the first message sequenced at or after it.
		stmt, target := a.q.CursorsLockForResetToSeq, any(pos.seq)
		if pos.isTime {
			stmt, target = a.q.CursorsLockForResetToTime, pos.at
		}
		rows, err := tx.Query(ctx, stmt, s.Group, s.Topic, s.partitions(), target)
		if err != nil {
			return fmt.Errorf("admin: reset: read cursors: %w", err)
		}
		var (
			parts []int32
			seqs  []int64
		)
		for rows.Next() {
			var (
				r    CursorReset
				head int64
			)
			if err := rows.Scan(&r.Partition, &r.From, &head, &r.To); err != nil {
				rows.Close()
				return fmt.Errorf("admin: reset: read cursors: %w", err)
			}
			if r.To > head {
				rows.Close()
				return &SeqRangeError{Topic: s.Topic, Partition: r.Partition, Seq: r.To, Head: head}
			}
			r.Topic = s.Topic
			resets = append(resets, r)
			parts = append(parts, int32(r.Partition))
			seqs = append(seqs, r.To)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("admin: reset: read cursors: %w", err)
		}
		if err := s.complete(len(resets)); err != nil {
			return err
		}
		if _, err = tx.Exec(ctx, a.q.CursorsReset, s.Group, s.Topic, parts, seqs); err != nil {
			return fmt.Errorf("admin: reset: %w", err)
		}
		// Messages held back are after the new cursor (delivered again)
		// or before it (skipped): either way no longer held.
		if _, err = tx.Exec(ctx, a.q.HeldClear, s.Group, s.Topic, parts); err != nil {
			return fmt.Errorf("admin: reset: forget held messages: %w", err)
		}
		return a.announce(ctx, tx, s)
	})
	if err != nil {
		return nil, a.explain(ctx, s, schemaErr(err, a.cfg.Schema))
	}
	a.logger.Info("Cursors reset", watermill.LogFields{"group": s.Group, "topic": s.Topic, "resets": resets})
	return resets, nil
}

// announce tells the scope's lease managers, when tx commits, that its
// cursors changed: they balance at once (a paused partition is given
// back, a resumed or reset one taken) rather than at their next heartbeat.
func (a *Admin) announce(ctx context.Context, tx pgx.Tx, s Scope) error {
	if _, err := tx.Exec(ctx, a.q.MembersChanged, s.Group, s.Topic, names.MembersChannel(a.cfg.Schema)); err != nil {
		return fmt.Errorf("admin: notify the group's members: %w", err)
	}
	return nil
}

// constructed refuses a zero Admin (not made by New).
func (a *Admin) constructed() error {
	if a.q == nil {
		return errs.NotConstructed("admin.Admin", "admin.New")
	}
	return nil
}

// schemaErr turns the "relation does not exist" of a schema that was
// dropped (or never migrated) into outbox.ErrNotMigrated.
func schemaErr(err error, schema string) error { return schemacheck.Wrap(err, schema) }
