package direct

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/notifier"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/origin"
	"github.com/millrace/watermill-outbox/internal/queuevacuum"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/startstop"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Config is one forwarder-only topic's forwarding.
type Config struct {
	// Pool is the database (its publishers' notifications wake the loop).
	// Store, when set, replaces it for the loop's statements and Lease.Store
	// for the leases' (the simulator's models; no notifications then).
	Pool                 *pgxpool.Pool
	Store                Store
	Schema, Group, Topic string
	Source               string // the Forwarder's source ("" for none)
	Partitions           int    // the topic's partition count
	Incarnation          string // the topic's (MetadataIncarnation)
	TargetTopic          string
	Target               Target
	// Lease configures the partitions' leases (Schema, Pool, Group, Topic
	// and Partitions are set from the fields above).
	Lease lease.Config
	// BatchSize bounds the messages of one partition in a round.
	BatchSize int
	// Poll is how long a round that found nothing waits before the next
	// one unless a publisher's notification comes first.
	Poll time.Duration
	// MaxIdlePoll is how far an idle loop's poll stretches past Poll,
	// doubling, while its LISTEN is live and no look at the idle pace
	// found work that no notification announced (tune.IdlePoll, as the
	// sequencer's): a quiet topic then costs a read per MaxIdlePoll.
	// Default DefaultMaxIdlePoll; at most Poll (no stretch) when lower or
	// negative.
	MaxIdlePoll time.Duration
	// Pace is the busy pace: a round that forwarded n messages is followed
	// by the next one tune.FollowLoad(Pace, n) after its start, at the
	// earliest (0: at once).
	Pace time.Duration
	// BackoffBase and BackoffMax bound how long a partition whose round
	// failed waits (doubling with its failures in a row).
	BackoffBase, BackoffMax time.Duration
	// SendTimeout bounds a round's send (before a lease can expire).
	SendTimeout time.Duration
	// RejectHandler takes what the target rejects (dead letters), in the
	// round's transaction.
	RejectHandler outboxtype.RejectHandler
	// Prepare, when set, runs on each message before it is sent (the
	// Forwarder sets the source).
	Prepare func(*message.Message)
	// Counts are the running totals (nil: none kept).
	Counts *Counts
	Logger watermill.LoggerAdapter
}

// Counts are a topic's running totals.
type Counts struct {
	Rounds, Messages, Failures, Rejected, Reconciled int64
}

// part is a held partition.
type part struct {
	l         *lease.Lease
	cursor    int64 // the last seq recorded forwarded
	reconcile bool  // Kafka may hold more than the cursor says
	waitUntil time.Time
	failures  int // rounds failed in a row
}

// FollowUpShare sets the least follow-up: after a round that forwarded messages the next one starts
// at least Pace/FollowUpShare after it unprompted (2 ms for the Default
// profile's 20 ms pace), so that a steady stream is taken in rounds of a
// few messages rather than one round per message.
const FollowUpShare = 10

// Loop forwards one forwarder-only topic: Run until ctx ends (or, driven
// by a caller, Step).
type Loop struct {
	cfg   Config
	store Store
	life  startstop.Service // of Run
	mgr   *lease.Manager    // of Step
	// compact vacuums pending as the sequencer does (queuevacuum says
	// why): here the forwarder empties it. nil on a Store of the
	// simulator.
	compact *queuevacuum.Vacuumer
	runCtx  context.Context // Run's, which the vacuums end with
	logger  watermill.LoggerAdapter
	// live says whether notifications arrive (tests only, export_test.go;
	// otherwise the listener's).
	live    func() bool
	wake    chan struct{} // a publisher's notification
	wakeNow chan struct{} // the relay's (names.RelayedPayload)

	mu    sync.Mutex
	parts map[int]*part
	cnt   Counts
}

// DefaultMaxIdlePoll is the default Config.MaxIdlePoll (the sequencer's).
const DefaultMaxIdlePoll = 10 * time.Second

// New returns the loop of cfg.
func New(cfg Config) *Loop {
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 100
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.MaxIdlePoll == 0 {
		cfg.MaxIdlePoll = DefaultMaxIdlePoll
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 100 * time.Millisecond
	}
	cfg.BackoffMax = max(cfg.BackoffMax, cfg.BackoffBase)
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = 10 * time.Second
	}
	store := cfg.Store
	var compact *queuevacuum.Vacuumer
	if store == nil {
		store = NewPGStore(cfg.Pool, cfg.Schema)
		compact = queuevacuum.New(cfg.Pool, cfg.Schema, cfg.Logger)
	}
	return &Loop{
		life:    startstop.Service{Name: "forwarder-only topic " + cfg.Topic},
		cfg:     cfg,
		store:   store,
		compact: compact,
		logger:  cfg.Logger.With(watermill.LogFields{"topic": cfg.Topic, "path": "forwarder-only"}),
		wake:    make(chan struct{}, 1),
		wakeNow: make(chan struct{}, 1),
		parts:   map[int]*part{},
	}
}

// Lookup returns the partition count of topic and whether it is
// forwarder-only (sentinel.ErrUnknownTopic when it is not registered).
func Lookup(ctx context.Context, pool *pgxpool.Pool, schema, topic string) (partitions int, forwardOnly bool, err error) {
	err = pool.QueryRow(ctx, dbsql.For(schema).TopicsForwardOnly, topic).Scan(&partitions, &forwardOnly)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, fmt.Errorf("%w: %q in schema %q", sentinel.ErrUnknownTopic, topic, schema)
	}
	return partitions, forwardOnly, err
}

// Incarnation returns the incarnation of topic (MetadataIncarnation).
func Incarnation(ctx context.Context, pool *pgxpool.Pool, schema, topic string) (string, error) {
	var us int64
	if err := pool.QueryRow(ctx, dbsql.For(schema).TopicsIncarnation, topic).Scan(&us); err != nil {
		return "", err
	}
	return strconv.FormatInt(us, 10), nil
}

// Stats returns the loop's running totals.
func (l *Loop) Stats() Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cnt
}

// notified wakes the loop for a notification on the pending channel.
func (l *Loop) notified(payload string) { l.poke(payload == names.RelayedPayload) }

// poke wakes the loop for a notification: relayed says that the
// log-based relay sent it (names.RelayedPayload), which starts a round at
// once (the relay's pace made the batch); a publisher's starts one no
// sooner than the pace after the last.
func (l *Loop) poke(relayed bool) {
	ch := l.wake
	if relayed {
		ch = l.wakeNow
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// manager returns the lease manager of the loop's config.
func (l *Loop) manager() (*lease.Manager, error) {
	lc := l.cfg.Lease
	lc.Schema, lc.Group, lc.Topic, lc.Partitions = l.cfg.Schema, l.cfg.Group, l.cfg.Topic, l.cfg.Partitions
	if lc.Store == nil {
		lc.Pool = l.cfg.Pool
	}
	return lease.NewManager(lc, l.logger)
}

// adopt starts forwarding a partition whose lease was acquired: it is
// reconciled with Kafka before its first read, after the backoff its
// previous holder recorded.
func (l *Loop) adopt(ls *lease.Lease) {
	l.mu.Lock()
	l.parts[ls.Partition()] = &part{l: ls, cursor: ls.Cursor(), reconcile: true, waitUntil: time.Now().Add(ls.Backoff())}
	l.mu.Unlock()
	l.poke(false)
}

// Step is one turn of Run's loop for a caller that drives it (the
// simulator): the lease manager's round (Manager.Step), then a round of
// forwarding. It reports whether the round forwarded anything. Stop ends
// what it started.
func (l *Loop) Step(ctx context.Context) (bool, error) {
	if l.mgr == nil {
		m, err := l.manager()
		if err != nil {
			return false, err
		}
		l.mgr = m
	}
	acquired, err := l.mgr.Step(ctx)
	if err != nil {
		return false, err
	}
	for _, ls := range acquired {
		l.adopt(ls)
	}
	n, _ := l.round(ctx)
	return n > 0, nil
}

// Held returns the partitions whose leases Step holds (sorted).
func (l *Loop) Held() []int {
	if l.mgr == nil {
		return nil
	}
	return l.mgr.Held()
}

// Stop gives back the leases Step took and leaves the group.
func (l *Loop) Stop(ctx context.Context) {
	l.releaseAll()
	if l.mgr != nil {
		l.mgr.Stop(ctx)
	}
}

// Run forwards until ctx ends; the leases are given back when it returns.
//
// It has the lifecycle of every long-running component
// (internal/startstop): it runs once (a second Run while it runs is
// ErrAlreadyRunning, a Run after it stopped ErrClosed), and Close stops it
// and waits until it returned.
func (l *Loop) Run(ctx context.Context) error {
	return l.life.Run(ctx, nil, l.run)
}

// Close stops Run and waits until it has returned.
func (l *Loop) Close() { l.life.Close() }

func (l *Loop) run(ctx context.Context) error {
	m, err := l.manager()
	if err != nil {
		return err
	}
	if observe.Enabled() {
		observe.Current().Forwarding(l.cfg.Source, l.cfg.TargetTopic) // its error series exist at 0 before the first round
	}
	l.runCtx = ctx
	if l.compact != nil {
		defer l.compact.Wait()
	}
	idle := tune.IdlePoll{Base: l.cfg.Poll, Max: l.cfg.MaxIdlePoll, Live: l.live}
	if l.cfg.Pool != nil && l.cfg.Store == nil {
		sub := notifier.Listen(l.cfg.Pool, names.PendingChannel(l.cfg.Schema), l.logger, l.notified)
		defer sub.Unlisten()
		idle.Live = sub.Live
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	leases := make(chan error, 1)
	l.life.Go(func() { leases <- m.Run(ctx, l.adopt) })
	// The rounds' schedule follows the sequencer's (SequencerConfig):
	// after a round that forwarded n messages the next one starts
	// tune.FollowLoad(Pace, n) after it, notified or not (publishers
	// notify at most every PublisherConfig.NotifyInterval, so a stream of
	// commits is found by these follow-ups, in rounds that grow with the
	// load); after a round that found nothing the follow-up doubles, up to
	// Poll, and on up to MaxIdlePoll while notifications are trusted
	// (tune.IdlePoll); a publisher's notification starts a round, not
	// sooner than the pace after the last one, the relay's at once.
	timer := time.NewTimer(0)
	defer timer.Stop()
	followUp, gap := time.Duration(0), time.Duration(0)
	poked := false // this round follows a notification (or a new lease)
	for {
		start := time.Now()
		n, full := l.round(ctx)
		gap = tune.FollowLoad(l.cfg.Pace, n)
		if n > 0 {
			if poked {
				idle.Announced()
			} else {
				idle.Unannounced(followUp)
			}
		}
		poked = false
		var wait time.Duration
		switch {
		case n > 0:
			followUp = max(gap, l.cfg.Pace/FollowUpShare, time.Millisecond)
			wait = followUp - time.Since(start)
		case followUp > 0:
			// Nothing came since: the next look is at the busy pace,
			// then doubling, while notifications wake it for new work.
			followUp = max(idle.Next(followUp), min(l.cfg.Pace, l.cfg.Poll))
			wait = followUp
		default:
			followUp = l.cfg.Poll
			wait = followUp
		}
		if full {
			wait = gap - time.Since(start)
		}
		if wait <= 0 && ctx.Err() == nil {
			continue
		}
		timer.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
			l.releaseAll()
			return <-leases
		case err := <-leases:
			l.releaseAll()
			return err
		case <-timer.C:
		case <-l.wakeNow:
			poked = true
		case <-l.wake:
			poked = true
			if d := gap - time.Since(start); d > 0 {
				timer.Reset(d)
				select {
				case <-ctx.Done():
				case <-timer.C:
				case <-l.wakeNow:
				}
			}
		}
	}
}

// releaseAll gives every lease back.
func (l *Loop) releaseAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, x := range l.parts {
		x.l.Done()
		delete(l.parts, p)
	}
}

// held returns the partitions ready for a round, in partition order;
// those whose lease ended are given back.
func (l *Loop) held(now time.Time) []*part {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*part, 0, len(l.parts))
	for p := range l.cfg.Partitions {
		x := l.parts[p]
		if x == nil {
			continue
		}
		if x.l.Context().Err() != nil {
			x.l.Done()
			delete(l.parts, p)
			continue
		}
		if now.Before(x.waitUntil) {
			continue
		}
		out = append(out, x)
	}
	return out
}

// drop gives a partition's lease back (it is lost or in doubt); whoever
// takes it next reconciles it.
func (l *Loop) drop(x *part) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.parts[x.l.Partition()] == x {
		delete(l.parts, x.l.Partition())
	}
	x.l.Done()
}

func (l *Loop) origin(x *part) origin.Origin {
	var w consumer.WriterRecord = x.l
	return origin.Origin{
		Source: l.cfg.Source, Schema: l.cfg.Schema, Group: l.cfg.Group, Partitions: l.cfg.Partitions,
		Topic: l.cfg.Topic, Partition: x.l.Partition(), Incarnation: l.cfg.Incarnation,
		Token: x.l.Token(), Writer: w,
	}
}
