package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/notifier"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/queuevacuum"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/internal/startstop"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// SequencerConfig configures a Sequencer.
type SequencerConfig struct {
	// Schema is the outbox schema (DefaultSchema when empty).
	Schema string
	// Pool is the connection pool the sequencer works through. Required.
	Pool *pgxpool.Pool
	// BatchSize bounds the messages sequenced in one pass, one transaction
	// (default 5000): the oldest pending messages of the partitions the
	// pass locked.
	BatchSize int
	// MaxPartitionsPerPass bounds how many partitions one pass locks
	// (default 256).
	MaxPartitionsPerPass int
	// PollInterval is the safety net: how often an idle sequencer looks for
	// new messages without being notified (default 500ms). While its
	// LISTEN connection is up and notifications have not missed anything,
	// the wait stretches beyond it, doubling up to MaxIdlePoll.
	PollInterval time.Duration
	// MaxIdlePoll is how far an idle sequencer's safety-net poll stretches
	// (default DefaultMaxIdlePoll, 10s; at most PollInterval when lower;
	// negative: no stretch). A sequencer that has found nothing doubles its
	// wait after every empty look, from PollInterval up to this, but only
	// while it listens for publishers' notifications on a live connection
	// (the process's LISTEN connection for its pool is up) and none of its
	// own polls found work that no notification had announced: a notification still starts a pass at
	// once, however long the sequencer idled. After its LISTEN connection
	// drops, or once a poll finds unannounced work (publishers with
	// PublisherConfig.DisableNotify, or the notifying transaction rolled
	// back), it polls every PollInterval again, until a notified pass finds
	// work. So a quiet schema costs one statement per MaxIdlePoll, and a
	// message whose transaction sent no NOTIFY waits at most MaxIdlePoll
	// after a long quiet spell, PollInterval once the sequencer has seen
	// one.
	MaxIdlePoll time.Duration
	// Debounce is how long an idle sequencer waits after a notification
	// before it runs, so that a burst of commits is sequenced in one pass
	// rather than one pass per commit (default 1ms; negative: none).
	Debounce time.Duration
	// MinPassInterval paces a busy sequencer (default 20ms; negative: no
	// floor). A pass that found work, but not a full batch, is followed by
	// the next one this long after it started, notified or not, so a stream
	// of commits is taken in passes of everything committed meanwhile
	// rather than in one pass per commit. A notification may start the
	// next pass sooner, by a wait that follows the load: 1/20 of
	// MinPassInterval after a pass that moved one message (1 ms of the
	// default), growing by 1/40 of it with each further message the pass
	// moved, never more than MinPassInterval (SequencerStats.Pace shows
	// it). So a message after a quiet spell waits about a millisecond, and
	// under load each pass carries more. After a pass that found
	// nothing the wait doubles, up to PollInterval, so messages whose
	// transaction did not notify (see PublisherConfig.NotifyInterval) are
	// found within about the time they were late. A full pass is followed
	// at once.
	MinPassInterval time.Duration
	// Alongside lets Run sequence while another Sequencer of the same
	// schema and database runs in this process. By default one Sequencer
	// per schema and database passes in a process: a Subscriber's own, a
	// pipeline's and one started by hand share that one, so a service that
	// runs a pipeline and a Router does not run two; the others stand by
	// and take over when it stops (Stats().Standby). Sequencers of
	// different processes always run side by side, safely.
	Alongside bool
	// DisableListen stops the sequencer from listening for publishers'
	// notifications; it then polls only.
	DisableListen bool
	// DisableNotify stops the sequencer from notifying subscribers (one
	// notification per topic per pass, naming the partitions that got new
	// messages: "topic:0,5,7") after it sequenced messages. Subscribers
	// then find messages by polling: after a quiet spell an idle partition
	// polls only once a second (see SubscriberConfig.Advanced.PollInterval),
	// so the first message after it can wait that long.
	DisableNotify bool
	// Clock is the time delayed messages (DeliverAt) are held against:
	// one is sequenced once Clock() reaches its time (default time.Now).
	// Tests set it to move time on (outboxtest.Runner.Advance) rather
	// than wait.
	Clock func() time.Time
}

// DefaultMaxIdlePoll is the default SequencerConfig.MaxIdlePoll.
const DefaultMaxIdlePoll = 10 * time.Second

func (c *SequencerConfig) setDefaults() {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.BatchSize == 0 {
		c.BatchSize = 5000
	}
	if c.MaxPartitionsPerPass == 0 {
		c.MaxPartitionsPerPass = 256
	}
	if c.PollInterval == 0 {
		c.PollInterval = 500 * time.Millisecond
	}
	if c.MaxIdlePoll == 0 {
		c.MaxIdlePoll = DefaultMaxIdlePoll
	}
	if c.Debounce == 0 {
		c.Debounce = time.Millisecond
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.MinPassInterval == 0 {
		c.MinPassInterval = 20 * time.Millisecond
	}
}

// Validate reports the first impossible setting.
func (c SequencerConfig) Validate() error {
	c.setDefaults()
	if err := names.Schema(c.Schema); err != nil {
		return err
	}
	switch {
	case c.Pool == nil:
		return &outboxtype.ConfigError{Field: "Pool", Reason: "required"}
	case c.BatchSize < 1:
		return &outboxtype.ConfigError{Field: "BatchSize", Reason: "must be at least 1"}
	case c.MaxPartitionsPerPass < 1:
		return &outboxtype.ConfigError{Field: "MaxPartitionsPerPass", Reason: "must be at least 1"}
	case c.PollInterval < 0:
		return &outboxtype.ConfigError{Field: "PollInterval", Reason: "must be positive"}
	}
	return nil
}

// Sequencer gives committed messages their place in their partition: a
// gap-free, strictly increasing seq, in the order their transactions became
// visible. It runs after commit, so a reader following seq can never skip a
// message whose transaction committed late.
//
// Any number of sequencers may run, e.g. one per instance: each partition is
// sequenced by one of them at a time (a row lock taken with SKIP LOCKED), and
// none of them waits for another.
//
// Its lifecycle is every long-running component's (internal/startstop): Run
// once, Close stops it and waits.
type Sequencer struct {
	cfg    SequencerConfig
	logger watermill.LoggerAdapter

	q             *dbsql.Queries
	listenChannel string
	notifyChannel string

	poke chan struct{}

	sequenced atomic.Int64
	passes    atomic.Int64
	pace      atomic.Int64 // the load-following gap Run set after its last pass (ns)
	idleWait  atomic.Int64 // Run's wait before its next unprompted look (ns)
	looks     atomic.Int64 // unprompted looks (anyPending) so far
	standby   atomic.Bool  // Run waits for the process's sequencer of the schema to stop

	// compact vacuums pending every queuevacuum.Every rows Run moved.
	compact *queuevacuum.Vacuumer

	db pgexec.DB // cfg.Pool adapted, for the schema check

	life startstop.Service
}

// NewSequencer creates a Sequencer. Start it with Run.
func NewSequencer(cfg SequencerConfig, logger watermill.LoggerAdapter) (*Sequencer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	seq := &Sequencer{
		cfg:           cfg,
		logger:        logger.With(watermill.LogFields{"component": "outbox.sequencer", "schema": cfg.Schema}),
		listenChannel: names.PendingChannel(cfg.Schema),
		notifyChannel: names.SequencedChannel(cfg.Schema),
		poke:          make(chan struct{}, 1),
	}
	seq.life.Name = "outbox.Sequencer"
	seq.db, _ = pgexec.FromDB(cfg.Pool) // a *pgxpool.Pool, checked by Validate
	seq.q = dbsql.For(cfg.Schema)
	seq.compact = queuevacuum.New(cfg.Pool, cfg.Schema, seq.logger)
	return seq, nil
}

// SequencerStats are running totals of a Sequencer.
type SequencerStats struct {
	Sequenced int64 // messages given a seq
	Passes    int64 // passes that sequenced at least one message
	// PendingVacuums counts the VACUUMs of the pending table Run ran: one
	// every 10,000 messages it moved, so that the queue stays small
	// whatever autovacuum's pace (docs/postgresql.md, The tables that churn).
	PendingVacuums int64
	// Standby is true while Run waits for another Sequencer of the schema
	// and database in this process to stop (see SequencerConfig.Alongside).
	Standby bool
	// Pace is how soon after the start of Run's last pass a notification
	// may start the next: short at light load, growing with the messages
	// a pass moves, up to MinPassInterval (see MinPassInterval).
	Pace time.Duration
	// IdlePoll is how long after its last look Run looks again unprompted:
	// the busy pace after a pass that found work, doubling with every
	// empty look up to PollInterval, and on up to MaxIdlePoll while
	// notifications are trusted (see MaxIdlePoll).
	IdlePoll time.Duration
}

// Stats returns the running totals.
func (s *Sequencer) Stats() SequencerStats {
	st := SequencerStats{Sequenced: s.sequenced.Load(), Passes: s.passes.Load(), Pace: time.Duration(s.pace.Load()), Standby: s.standby.Load(),
		IdlePoll: time.Duration(s.idleWait.Load())}
	if s.compact != nil {
		st.PendingVacuums = s.compact.Vacuums()
	}
	return st
}

// Run sequences until ctx is cancelled or Close is called, and returns nil
// then. Database errors are logged and retried with the shared backoff
// (internal/backoff: 50–100 ms after the first, doubling to 2.5–5 s),
// never returned, except a schema it cannot work with, found at the start:
// one that was never migrated (ErrNotMigrated) or was migrated by a newer
// release (ErrSchemaTooNew), which retrying would not mend; Run may then be
// called again (after Migrate, say). Otherwise Run runs once: a second Run
// while it runs is ErrAlreadyRunning, a Run after Close or after Run
// returned is ErrClosed.
func (s *Sequencer) Run(ctx context.Context) error {
	if s.q == nil {
		return errs.NotConstructed("outbox.Sequencer", "outbox.NewSequencer")
	}
	return s.life.Run(ctx, s.start, s.run)
}

// start refuses a schema it cannot work with: retrying would not mend it.
// Any other error (the database not up yet, say) is met again by the first
// pass, and retried like every database error.
func (s *Sequencer) start(ctx context.Context) error {
	if err := s.checkSchema(ctx); errors.Is(err, ErrNotMigrated) || errors.Is(err, ErrSchemaTooNew) {
		return err
	}
	return nil
}

// run is Run's loop, until ctx ends.
func (s *Sequencer) run(ctx context.Context) error {
	if !s.cfg.Alongside {
		release, ok := s.own(ctx)
		if !ok {
			return nil
		}
		defer release()
	}
	idle := tune.IdlePoll{Base: s.cfg.PollInterval, Max: s.cfg.MaxIdlePoll}
	if !s.cfg.DisableListen {
		// The process's shared LISTEN connection for this pool.
		sub := notifier.Listen(s.cfg.Pool, s.listenChannel, s.logger, func(payload string) {
			if sequencerWakesOn(payload) {
				s.wake()
			}
		})
		defer sub.Unlisten()
		idle.Live = sub.Live
	}

	defer s.compact.Wait()
	var failures backoff.Streak // backoff.Default
	// followUp is the wait before the next unprompted look: MinPassInterval
	// after a productive pass, doubling with every empty look up to
	// PollInterval, and on up to MaxIdlePoll while notifications are
	// trusted (idle; 0: before the first look, and after an error).
	followUp := time.Duration(0)
	minGap := max(s.cfg.MinPassInterval, 0)
	// gap is how long after the start of the last pass a notification may
	// start the next one: it follows the load (tune.FollowLoad), short
	// after a pass that moved a message or two, minGap after a full one.
	gap := tune.FollowLoad(minGap, 0)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var nextDue time.Time // the earliest delayed message's time, as last read (zero: none)
	prompted := true      // the first pass, and passes after a notification or a full pass
	poked := false        // this pass follows a notification
	due := false          // this look follows a wait cut short for a delayed message
	for {
		started := time.Now()
		var (
			n    int
			more bool
			err  error
		)
		checked := !prompted // anyPending tells nextDue
		if !prompted {
			var any bool
			any, nextDue = s.anyPending(ctx)
			if any && !due {
				idle.Unannounced(followUp)
			}
			prompted = any
		}
		if prompted {
			n, more, err = s.pass(ctx)
		}
		if poked && n > 0 {
			idle.Announced()
		}
		poked = false
		if n > 0 {
			s.compact.Moved(ctx, n)
		}
		if ctx.Err() != nil {
			return nil
		}
		prompted = false
		if err == nil {
			failures.Succeeded()
			gap = tune.FollowLoad(minGap, n)
			s.pace.Store(int64(gap))
		}
		var wait time.Duration
		switch {
		case err != nil:
			wait, followUp = failures.Failed(), 0
			s.logger.Error("Sequencing failed, retrying", err, watermill.LogFields{"attempt": failures.Failures(), "retry_in": wait})
		case more:
			prompted = true
			continue
		case n > 0:
			followUp = max(minGap, time.Millisecond)
			wait = followUp - time.Since(started)
		default: // found nothing: the wait doubles, PollInterval and beyond while notifications can be trusted
			followUp = idle.Next(followUp)
			wait = followUp
		}
		s.idleWait.Store(int64(followUp))
		if wait <= 0 {
			prompted = n > 0 // (a productive pass that took its whole gap)
			continue
		}
		// A delayed message wakes the sequencer when it is due, not at
		// the next poll. After a prompted pass that moved nothing (a new
		// delayed message, say) the earliest due time is read afresh;
		// after a productive one the follow-up check reads it soon.
		if !checked && n == 0 && err == nil {
			_, nextDue = s.anyPending(ctx)
		}
		due = false
		if d := max(nextDue.Sub(s.cfg.Clock()), time.Millisecond); !nextDue.IsZero() && d < wait {
			wait, due = d, true
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-s.poke:
			prompted, poked = true, true
			if err == nil {
				// Not before the debounce, nor closer than gap to the
				// start of the previous pass.
				if d := max(s.cfg.Debounce, gap-time.Since(started)); d > 0 {
					select {
					case <-ctx.Done():
						return nil
					case <-time.After(d):
					}
				}
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// anyPending tells an unprompted pass (a follow-up or the safety-net
// poll, which usually find nothing) whether a pass is worth its three
// round trips: one statement, outside any transaction. On an error it says
// yes, and the pass reports the error. It also returns when the earliest
// delayed message is due (zero: none is waiting).
func (s *Sequencer) anyPending(ctx context.Context) (bool, time.Time) {
	s.looks.Add(1)
	var any bool
	var next *time.Time
	if err := s.cfg.Pool.QueryRow(ctx, s.q.PendingAny, s.cfg.Clock()).Scan(&any, &next); err != nil {
		return true, time.Time{}
	}
	if next == nil {
		return any, time.Time{}
	}
	return any, *next
}

// sequencerWakesOn reports whether a notification of the pending channel
// with payload starts a pass: a publisher's does; the log-based relay's
// (names.RelayedPayload) says it put forwarder-only messages into pending,
// which the sequencer leaves alone.
func sequencerWakesOn(payload string) bool { return payload != names.RelayedPayload }

func (s *Sequencer) wake() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// Close stops Run and waits for it to return: for the pass under way to
// see its context cancelled, and for the sequencer's LISTEN subscription to
// be given up. It may be called more than once, before or after Run, and
// always returns nil; a Run after Close returns ErrClosed.
func (s *Sequencer) Close() error {
	s.life.Close()
	return nil
}

// checkSchema refuses a schema that was never migrated (ErrNotMigrated) or
// was migrated by a newer release (ErrSchemaTooNew); checked once per pool
// and schema.
func (s *Sequencer) checkSchema(ctx context.Context) error {
	return schemacheck.Check(ctx, s.cfg.Pool, s.db, s.cfg.Schema)
}

// SequenceAll runs passes until no committed message is left unsequenced in
// partitions this sequencer can lock, and returns how many it sequenced.
// Useful in tests, tools and demos; services use Run.
func (s *Sequencer) SequenceAll(ctx context.Context) (int, error) {
	total := 0
	for {
		n, more, err := s.pass(ctx)
		total += n
		if err != nil || !more {
			return total, err
		}
	}
}

// pass runs one sequencing pass in one transaction. It returns how many
// messages it sequenced and whether more may be waiting (the pass was full,
// or more partitions had work than one pass takes). A schema that was never
// migrated, or was dropped, gives ErrNotMigrated, one migrated by a newer
// release ErrSchemaTooNew (checked once per pool and schema).
func (s *Sequencer) pass(ctx context.Context) (n int, more bool, err error) {
	if s.q == nil {
		return 0, false, errs.NotConstructed("outbox.Sequencer", "outbox.NewSequencer")
	}
	if err := s.checkSchema(ctx); err != nil {
		return 0, false, err
	}
	defer func() { err = schemacheck.Wrap(err, s.cfg.Schema) }()
	started := time.Now()
	var ages map[string]time.Duration // the oldest message moved, per topic; only for an observer
	if observe.Enabled() {
		ages = map[string]time.Duration{}
	}
	traced := observe.StartPassTrace() // the moved messages' trace context, for the span's links
	defer func() {
		if n > 0 || err != nil {
			observe.RecordInternal(ctx, "outbox sequencer pass", started, err, traced.Links(),
				attribute.String("outbox.schema", s.cfg.Schema), attribute.Int("outbox.sequenced", n),
				attribute.Int64("outbox.traced", traced.Traced))
		}
		if err == nil && n > 0 {
			observe.Current().SequencerPass(n, time.Since(started), ages)
		}
	}()
	// Two round trips for a pass that moves messages (three when the
	// partitions it may lock hold nothing): BEGIN goes in one pipeline with
	// the statement that locks the partitions, COMMIT in one with the
	// statement that moves their messages. The move must be a statement of
	// its own, after the lock: its snapshot then sees every pass that
	// committed in those partitions before their locks were ours.
	conn, err := s.cfg.Pool.Acquire(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("outbox: sequencer: acquire a connection: %w", err)
	}
	defer conn.Release()
	open := false // a transaction of ours may be open on conn
	defer func() {
		if err != nil && open {
			// A connection left in a transaction is closed by the pool on
			// Release; a rollback keeps it.
			_, _ = conn.Exec(context.WithoutCancel(ctx), "rollback")
		}
	}()
	var topics []string
	var parts []int32
	open = true
	lock := &pgx.Batch{}
	lock.Queue("begin")
	now := s.cfg.Clock()
	lock.Queue(s.q.PartitionsLockPending, s.cfg.MaxPartitionsPerPass, s.cfg.BatchSize, now)
	br := conn.SendBatch(ctx, lock)
	if _, err = br.Exec(); err != nil {
		_ = br.Close()
		return 0, false, fmt.Errorf("outbox: sequencer: begin: %w", err)
	}
	rows, err := br.Query()
	if err == nil {
		for rows.Next() {
			var t string
			var p int32
			if err = rows.Scan(&t, &p); err != nil {
				break
			}
			topics = append(topics, t)
			parts = append(parts, p)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, false, fmt.Errorf("outbox: sequencer: lock partitions: %w", err)
	}
	if len(topics) == 0 {
		if _, err = conn.Exec(ctx, "commit"); err != nil {
			return 0, false, fmt.Errorf("outbox: sequencer: commit: %w", err)
		}
		open = false
		return 0, false, nil
	}
	var channel *string // NULL: no notification
	if !s.cfg.DisableNotify {
		channel = &s.notifyChannel
	}
	move := &pgx.Batch{}
	move.Queue(s.q.PendingSequence, topics, parts, s.cfg.BatchSize, channel, traced.Limit, traced.Fields, now)
	move.Queue("commit")
	br = conn.SendBatch(ctx, move)
	rows, err = br.Query()
	if err == nil {
		for rows.Next() {
			var topic string
			var sum, maxPerPartition int64
			var oldest float64
			var tracedHere int64
			var carriers []string
			if err = rows.Scan(&topic, &sum, &maxPerPartition, nil, &oldest, &tracedHere, &carriers); err != nil {
				break
			}
			n += int(sum)
			traced.Traced += tracedHere
			traced.Carriers = append(traced.Carriers, carriers...)
			if ages != nil {
				ages[topic] = time.Duration(oldest * float64(time.Second))
			}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		_ = br.Close()
		return 0, false, fmt.Errorf("outbox: sequencer: move: %w", err)
	}
	if _, err = br.Exec(); err != nil {
		_ = br.Close()
		return 0, false, fmt.Errorf("outbox: sequencer: commit: %w", err)
	}
	if err = br.Close(); err != nil {
		return 0, false, fmt.Errorf("outbox: sequencer: commit: %w", err)
	}
	open = false
	if n > 0 {
		s.sequenced.Add(int64(n))
		s.passes.Add(1)
	}
	return n, n >= s.cfg.BatchSize || len(topics) == s.cfg.MaxPartitionsPerPass, nil
}

// processSequencers holds, per schema and database, the semaphore of the
// Sequencer that passes in this process (SequencerConfig.Alongside).
var processSequencers sync.Map // ownerKey → chan struct{} (capacity 1)

// ownerKey names the schema and database s sequences: the same for every
// pool that connects to the same database.
func (s *Sequencer) ownerKey() string {
	cc := s.cfg.Pool.Config().ConnConfig
	return fmt.Sprintf("%s:%d/%s/%s", cc.Host, cc.Port, cc.Database, s.cfg.Schema)
}

// own makes s the Sequencer of its schema and database in this process,
// waiting (as a standby) while another one is; ok is false when ctx ended
// first. release gives the place up.
func (s *Sequencer) own(ctx context.Context) (release func(), ok bool) {
	v, _ := processSequencers.LoadOrStore(s.ownerKey(), make(chan struct{}, 1))
	sem := v.(chan struct{})
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, true
	default:
	}
	s.standby.Store(true)
	defer s.standby.Store(false)
	s.logger.Info("Another sequencer of this schema runs in this process: standing by until it stops (SequencerConfig.Alongside runs both)", nil)
	select {
	case sem <- struct{}{}:
		s.logger.Info("Sequencing: the other sequencer of this schema in this process stopped", nil)
		return func() { <-sem }, true
	case <-ctx.Done():
		return nil, false
	}
}
