package direct

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	wake    chan struct{}

	mu    sync.Mutex
	parts map[int]*part
	cnt   Counts
}

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
		parts:   map[int]*part{},
	}
}

// Lookup returns the partition count of topic and whether it is
// forwarder-only (outboxtype.ErrUnknownTopic when it is not registered).
func Lookup(ctx context.Context, pool *pgxpool.Pool, schema, topic string) (partitions int, forwardOnly bool, err error) {
	err = pool.QueryRow(ctx, dbsql.For(schema).TopicsForwardOnly, topic).Scan(&partitions, &forwardOnly)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, fmt.Errorf("%w: %q in schema %q", outboxtype.ErrUnknownTopic, topic, schema)
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

func (l *Loop) poke() {
	select {
	case l.wake <- struct{}{}:
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
	l.poke()
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
	if l.cfg.Pool != nil && l.cfg.Store == nil {
		sub := notifier.Listen(l.cfg.Pool, names.PendingChannel(l.cfg.Schema), l.logger, func(string) { l.poke() })
		defer sub.Unlisten()
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
	// Poll; a notification starts a round, not sooner than the pace after
	// the last one.
	timer := time.NewTimer(0)
	defer timer.Stop()
	followUp, gap := time.Duration(0), time.Duration(0)
	for {
		start := time.Now()
		n, full := l.round(ctx)
		gap = tune.FollowLoad(l.cfg.Pace, n)
		var wait time.Duration
		switch {
		case n > 0:
			followUp = max(gap, l.cfg.Pace/FollowUpShare, time.Millisecond)
			wait = followUp - time.Since(start)
		case followUp > 0:
			// Nothing came since: the next look is at the busy pace,
			// then doubling, while notifications wake it for new work.
			followUp = min(max(2*followUp, l.cfg.Pace), l.cfg.Poll)
			wait = followUp
		default:
			wait = l.cfg.Poll
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
		case <-l.wake:
			if d := gap - time.Since(start); d > 0 {
				timer.Reset(d)
				select {
				case <-ctx.Done():
				case <-timer.C:
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

// round runs one round over the held partitions. It returns how many
// messages it recorded forwarded (or rejected), and whether a partition's
// read came back full (a backlog: the next round should not wait for a
// notification).
func (l *Loop) round(ctx context.Context) (n int, full bool) {
	now := time.Now()
	parts := l.held(now)
	ready := parts[:0:0]
	for _, x := range parts {
		if x.reconcile && !l.reconcile(ctx, x) {
			continue
		}
		ready = append(ready, x)
	}
	if len(ready) == 0 || ctx.Err() != nil {
		return 0, false
	}
	batches, err := l.read(ctx, ready, now)
	if err != nil {
		l.logger.Error("Cannot read the forwarder-only topic's pending messages", err, nil)
		l.readFailed(ready, fmt.Errorf("read pending: %w", err))
		return 0, false
	}
	if len(batches) == 0 {
		return 0, false
	}
	bs := make([]*Batch, len(batches))
	for i, b := range batches {
		bs[i] = &b.Batch
		full = full || len(b.Messages) >= l.cfg.BatchSize
	}
	start := time.Now()
	sendCtx, cancel := context.WithTimeout(ctx, l.cfg.SendTimeout)
	l.cfg.Target.SendRound(sendCtx, l.cfg.TargetTopic, bs)
	cancel()
	l.observe(batches, time.Since(start))
	// What Kafka took is recorded even when the Forwarder is closing, so
	// that the next owner has nothing to reconcile.
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.SendTimeout)
	defer cancel()
	n = l.record(recordCtx, batches)
	if l.compact != nil && n > 0 && l.runCtx != nil {
		l.compact.Moved(l.runCtx, n)
	}
	return n, full
}

// observe reports a round's sends to the metrics, per partition.
func (l *Loop) observe(batches []*readBatch, took time.Duration) {
	if !observe.Enabled() {
		return
	}
	for _, b := range batches {
		n := max(0, min(b.Done, len(b.Messages)))
		bytes := 0
		for _, m := range b.Messages[:n] {
			bytes += len(m.Payload)
			for k, v := range m.Metadata {
				bytes += len(k) + len(v)
			}
		}
		kind := ""
		switch {
		case b.Err == nil:
		case errors.Is(b.Err, outboxtype.ErrPoison):
			kind = "poison"
		case errors.Is(b.Err, context.DeadlineExceeded):
			kind = "timeout"
		default:
			kind = "broker"
		}
		observe.Current().Forwarded(l.cfg.Source, l.cfg.TargetTopic, n, bytes, took, kind)
	}
}

// reconcile makes x's cursor say what Kafka holds (see the package
// comment); false: x is not ready this round.
func (l *Loop) reconcile(ctx context.Context, x *part) bool {
	held, err := l.cfg.Target.Reconcile(x.l.Context(), l.origin(x), l.cfg.TargetTopic, x.cursor)
	if err != nil {
		l.failed(x, fmt.Errorf("reconcile with Kafka: %w", err))
		return false
	}
	if len(held) > 0 {
		ids := make([]int64, len(held))
		for i, h := range held {
			ids[i] = h.PendingID
		}
		last := held[len(held)-1].Seq
		moved, err := l.forwarded(ctx, nil, []*part{x}, []int64{last}, [][]int64{ids})
		if err != nil {
			l.failed(x, err)
			return false
		}
		if !moved[x.l.Partition()] {
			l.drop(x)
			return false
		}
		l.logger.Info("Kafka held messages of a forwarder-only partition the cursor had not moved past (a previous owner committed them and stopped before recording them): recorded them forwarded", watermill.LogFields{
			"partition": x.l.Partition(), "from_seq": x.cursor + 1, "to_seq": last,
		})
		x.cursor = last
		l.mu.Lock()
		l.cnt.Reconciled += int64(len(held))
		l.mu.Unlock()
	}
	x.reconcile = false
	return true
}

// failed notes a failure of partition x: it is reconciled before its
// next read, after a backoff that doubles with its failures in a row,
// recorded on its cursor row (last error and retry time, as a
// Subscriber's are: status and the console show them).
func (l *Loop) failed(x *part, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.l.Context()), l.cfg.SendTimeout)
	defer cancel()
	l.backOff(ctx, x, err, true, true)
}

// readFailed notes that the read of the ready partitions failed: nothing
// was sent, so none needs reconciling, but each backs off and records the
// failure on its cursor row (as failed does; all of them within one
// SendTimeout, and none more once a record fails: the database is likely
// what failed).
func (l *Loop) readFailed(ready []*part, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.SendTimeout)
	defer cancel()
	record := true
	for _, x := range ready {
		record = l.backOff(ctx, x, err, false, record) && record
	}
}

// backOff puts x's next read after a backoff that doubles with its
// failures in a row, flags it for reconciling when reconcile is set, and
// records err and the retry time on its cursor row when record is set. It
// reports whether the record was written (or the lease found lost).
func (l *Loop) backOff(ctx context.Context, x *part, err error, reconcile, record bool) bool {
	if errors.Is(err, lease.ErrLeaseLost) || x.l.Context().Err() != nil {
		l.drop(x)
		return true
	}
	x.failures++
	retryIn := tune.ExponentialBackoff(l.cfg.BackoffBase, l.cfg.BackoffMax, x.failures)
	l.logger.Info("Forwarding a forwarder-only partition failed: it is retried (reconciled with Kafka first when a send may have happened)", watermill.LogFields{
		"partition": x.l.Partition(), "err": err.Error(), "retry_in": retryIn,
	})
	x.reconcile = x.reconcile || reconcile
	x.waitUntil = time.Now().Add(retryIn)
	l.mu.Lock()
	l.cnt.Failures++
	l.mu.Unlock()
	if !record {
		return false
	}
	if rerr := x.l.RecordRetry(ctx, nil, err, retryIn); rerr != nil {
		if errors.Is(rerr, lease.ErrLeaseLost) {
			l.drop(x)
			return true
		}
		l.logger.Error("Cannot record the failure on the cursor row", rerr, watermill.LogFields{"partition": x.l.Partition()})
		return false
	}
	return true
}

// readBatch is a Batch and what recording it needs.
type readBatch struct {
	Batch
	x   *part
	ids []int64 // the pending ids of Messages
}

// read reads every ready partition's next messages in one statement and
// numbers them from each partition's cursor.
func (l *Loop) read(ctx context.Context, ready []*part, now time.Time) ([]*readBatch, error) {
	partitions := make([]int32, len(ready))
	byPart := make(map[int]*part, len(ready))
	for i, x := range ready {
		partitions[i] = int32(x.l.Partition())
		byPart[x.l.Partition()] = x
	}
	rows, err := l.store.ReadPending(ctx, l.cfg.Topic, partitions, l.cfg.BatchSize, now)
	if err != nil {
		return nil, err
	}
	var out []*readBatch
	var cur *readBatch
	for _, r := range rows {
		p, id, uuid, key, meta, payload := int32(r.Partition), r.ID, r.UUID, r.Key, r.Metadata, r.Payload
		x := byPart[int(p)]
		if x == nil {
			return nil, fmt.Errorf("direct: the read returned partition %d, not one of %v", p, partitions)
		}
		if cur == nil || cur.x != x {
			cur = &readBatch{x: x, Batch: Batch{From: l.origin(x)}}
			out = append(out, cur)
		}
		seq := x.cursor + int64(len(cur.Messages)) + 1
		msg := message.NewMessage(uuid, payload)
		for k, v := range meta {
			msg.Metadata.Set(k, v)
		}
		msg.Metadata.Set(consumer.MetadataTopic, l.cfg.Topic)
		msg.Metadata.Set(consumer.MetadataPartition, strconv.Itoa(int(p)))
		msg.Metadata.Set(consumer.MetadataSeq, strconv.FormatInt(seq, 10))
		msg.Metadata.Set(consumer.MetadataID, consumer.StableID(l.cfg.Topic, int(p), seq))
		msg.Metadata.Set(consumer.MetadataAttempt, "1")
		if key != "" {
			msg.Metadata.Set(consumer.MetadataPartitionKey, key)
		}
		if l.cfg.Incarnation != "" {
			msg.Metadata.Set(consumer.MetadataIncarnation, l.cfg.Incarnation)
		}
		msg.Metadata.Set(MetadataPendingID, strconv.FormatInt(id, 10))
		if l.cfg.Prepare != nil {
			l.cfg.Prepare(msg)
		}
		cur.Messages = append(cur.Messages, msg)
		cur.ids = append(cur.ids, id)
	}
	return out, nil
}

// record ends a round: each partition's cursor moves past what Kafka
// took (and past a message it rejected, dead-lettered in the same
// transaction), and those rows leave pending. It returns the messages
// recorded forwarded or rejected.
func (l *Loop) record(ctx context.Context, batches []*readBatch) int {
	var (
		parts []*part
		lasts []int64
		ids   [][]int64
		rej   []outboxtype.RejectedMessage
		fails []*readBatch
	)
	for _, b := range batches {
		n := max(0, min(b.Done, len(b.Messages)))
		poison := b.Err != nil && n < len(b.Messages) && errors.Is(b.Err, outboxtype.ErrPoison)
		end := n
		if poison {
			end = n + 1
			m := b.Messages[n]
			rej = append(rej, outboxtype.RejectedMessage{
				Group: l.cfg.Group, Topic: l.cfg.Topic, Partition: b.x.l.Partition(), Seq: b.x.cursor + int64(end), UUID: m.UUID,
				PartitionKey: m.Metadata.Get(consumer.MetadataPartitionKey), Metadata: map[string]string(m.Metadata), Payload: m.Payload,
				Reason: b.Err, Attempts: 1, FirstFailure: time.Now(), LastFailure: time.Now(),
			})
		}
		if b.Err != nil && !poison {
			fails = append(fails, b)
		}
		if end == 0 {
			continue
		}
		parts = append(parts, b.x)
		lasts = append(lasts, b.x.cursor+int64(end))
		ids = append(ids, b.ids[:end])
	}
	recorded := 0
	if len(parts) > 0 {
		moved, err := l.commit(ctx, parts, lasts, ids, rej)
		for i, x := range parts {
			switch {
			case err != nil:
				l.failed(x, fmt.Errorf("record the round forwarded: %w", err))
			case !moved[x.l.Partition()]:
				l.drop(x) // the lease is gone: its next owner reconciles it
			default:
				recorded += int(lasts[i] - x.cursor)
				x.cursor = lasts[i]
				if !slices.ContainsFunc(fails, func(b *readBatch) bool { return b.x == x }) {
					x.failures = 0
				}
			}
		}
		if err != nil {
			rej = nil
		}
	}
	// After the moves, which clear a cursor row's last error.
	for _, b := range fails {
		l.failed(b.x, b.Err)
	}
	l.mu.Lock()
	l.cnt.Rounds++
	l.cnt.Messages += int64(recorded - len(rej))
	l.cnt.Rejected += int64(len(rej))
	l.mu.Unlock()
	return recorded
}

// commit records parts forwarded to lasts, their rows ids gone, rej
// dead-lettered, and returns the partitions it moved: without dead letters
// in one statement of its own; with them in one transaction, which a
// partition whose lease is gone rolls back whole (nothing moved).
func (l *Loop) commit(ctx context.Context, parts []*part, lasts []int64, ids [][]int64, rej []outboxtype.RejectedMessage) (map[int]bool, error) {
	if len(rej) == 0 {
		return l.forwarded(ctx, nil, parts, lasts, ids)
	}
	tx, err := l.store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, m := range rej {
		if err := l.cfg.RejectHandler.HandleReject(ctx, tx, m); err != nil {
			return nil, fmt.Errorf("dead-letter %s/%d/%d: %w", m.Topic, m.Partition, m.Seq, err)
		}
	}
	moved, err := l.forwarded(ctx, tx, parts, lasts, ids)
	if err != nil {
		return nil, err
	}
	if len(moved) != len(parts) {
		return map[int]bool{}, nil
	}
	return moved, tx.Commit(ctx)
}

// forwarded records parts forwarded to lasts in tx (Store.Forwarded) and
// returns the partitions whose cursor moved.
func (l *Loop) forwarded(ctx context.Context, tx pgx.Tx, parts []*part, lasts []int64, ids [][]int64) (map[int]bool, error) {
	if len(parts) == 0 {
		return map[int]bool{}, nil
	}
	moves := make([]Move, len(parts))
	for i, x := range parts {
		moves[i] = Move{Partition: x.l.Partition(), Token: x.l.Token(), Last: lasts[i], IDs: ids[i]}
	}
	return l.store.Forwarded(ctx, tx, l.cfg.Group, l.cfg.Topic, parts[0].l.Owner(), moves)
}
