package lease

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/startstop"
)

// Manager keeps this member's heartbeat, acquires and renews leases for its
// fair share of the partitions, and hands them to the caller. Create it with
// NewManager and start it with Run, which has the lifecycle of every
// long-running component (internal/startstop); or drive it with Step and
// Stop.
type Manager struct {
	cfg    Config
	logger watermill.LoggerAdapter
	store  Store
	group  Group

	life    startstop.Service
	wake    chan struct{} // a lease's worker called Done
	changed chan struct{} // the group changed (a notification on names.MembersChannel)
	frozen  atomic.Bool   // test hook: the Run loop ignores its timers, like a stalled process

	mu     sync.Mutex
	leases map[int]*Lease // leases held, or waiting for their worker's Done
	// stepped: Step created the cursor rows.
	stepped bool
	// seen is the group as the last balance found it (the balance's
	// goroutine only).
	seen struct {
		others []string
		active int
	}
}

// NewManager validates cfg and creates a Manager.
func NewManager(cfg Config, logger watermill.LoggerAdapter) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	store := cfg.Store
	if store == nil {
		pool, err := pgexec.FromDB(cfg.Pool)
		if err != nil {
			return nil, err
		}
		store = NewPGStore(pool, cfg.Relaxed, cfg.Schema)
	}
	m := &Manager{
		cfg: cfg,
		logger: logger.With(watermill.LogFields{
			"component": "outbox.lease", "schema": cfg.Schema,
			"group": cfg.Group, "topic": cfg.Topic, "member": cfg.MemberID,
		}),
		store:   store,
		group:   Group{Name: cfg.Group, Topic: cfg.Topic},
		wake:    make(chan struct{}, 1),
		changed: make(chan struct{}, 1),
		leases:  make(map[int]*Lease),
	}
	m.life.Name = "lease.Manager"
	return m, nil
}

// MemberID is this member's id in the group.
func (m *Manager) MemberID() string { return m.cfg.MemberID }

// Held returns the partitions whose lease this member currently holds,
// sorted: acquired, not released, and, by the local clock, renewed within
// TTL (so never a partition another member may already have acquired).
func (m *Manager) Held() []int {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int
	for p, l := range m.leases {
		if (l.state == stateActive || l.state == stateDraining) && now.Before(l.validUntil) {
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out
}

// Run creates the group's cursor rows if missing, then keeps this member's
// heartbeat and its share of the leases until ctx ends, calling onAcquire
// from Run's goroutine for each lease acquired. onAcquire must not block:
// it typically starts a worker that runs until l.Context() ends and then
// calls l.Done(). A lease is released only after its Done.
//
// When ctx ends, Run cancels every lease's context, waits up to TTL for
// their Done (renewing meanwhile), releases them, removes the member and
// returns nil: it returns at most about 2×TTL after ctx ended. Leases whose
// worker did not finish in time are left to expire. Database errors while
// running are logged and retried at the next renewal or balance: those
// keep their fixed intervals, never backing off, so that a lease is renewed
// within its TTL whenever the database answers.
//
// Run returns an error when the cursor rows cannot be created (the
// database unreachable, the schema dropped): the manager is then as it was,
// and the caller may Run it again after a backoff (the Subscriber's join
// retry, with internal/backoff). Otherwise Run runs once: a second Run
// while it runs is sentinel.ErrAlreadyRunning, a Run after Run returned is
// sentinel.ErrClosed; a nil onAcquire is sentinel.ErrInvalidArgument.
func (m *Manager) Run(ctx context.Context, onAcquire func(l *Lease)) error {
	if onAcquire == nil {
		return errs.NilArgument("lease.Manager.Run: onAcquire", "pass a callback that starts a worker for each lease")
	}
	return m.life.Run(ctx, m.start, func(ctx context.Context) error {
		m.run(ctx, onAcquire)
		return nil
	})
}

// run is Run's loop, until ctx ends and the leases are given back.
//
// It balances every BalanceInterval while the group changes, and, while
// it is settled and its changes are announced, at a pace that doubles up
// to MaxBalanceInterval (balancePace): a notification of a change, or a
// lease of this member's ending, brings the next balance forward.
func (m *Manager) run(ctx context.Context, onAcquire func(l *Lease)) {
	listening := m.listen()
	if listening != nil {
		defer listening.Unlisten()
	}
	renew := time.NewTicker(m.cfg.RenewInterval)
	defer renew.Stop()
	pace := balancePace{min: m.cfg.BalanceInterval, max: m.cfg.MaxBalanceInterval, listening: listening}
	wait := pace.next(m.balance(ctx, onAcquire))
	balance := time.NewTimer(wait)
	defer balance.Stop()
	due := time.Now().Add(wait)
	for {
		select {
		case <-ctx.Done():
			m.shutdown(ctx)
			return
		case <-renew.C:
			if !m.frozen.Load() {
				m.renew(ctx)
			}
		case <-balance.C:
			wait = m.cfg.BalanceInterval
			if !m.frozen.Load() {
				wait = pace.next(m.balance(ctx, onAcquire))
			}
			balance.Reset(wait)
			due = time.Now().Add(wait)
		case <-m.changed:
			// Balance now, through the timer: a notification and the
			// timer falling due together take one balance.
			pace.restart()
			if time.Until(due) > 0 {
				balance.Reset(0)
				due = time.Now()
			}
		case <-m.wake:
			if !m.frozen.Load() {
				m.releaseFinished(ctx)
			}
			// A lease ended: this member's share is short until a balance
			// takes it (or another member's) again.
			pace.restart()
			if time.Until(due) > m.cfg.BalanceInterval {
				balance.Reset(m.cfg.BalanceInterval)
				due = time.Now().Add(m.cfg.BalanceInterval)
			}
		}
	}
}

// balanced is what a balance found: settled when the group did not change
// since the previous balance and this member holds its share with nothing
// draining; and how soon the first other member expires (0: none live).
type balanced struct {
	settled        bool
	othersExpireIn time.Duration
}

// balance heartbeats, computes this member's share, gives back paused and
// surplus leases, releases finished ones, and acquires up to the share.
func (m *Manager) balance(ctx context.Context, onAcquire func(*Lease)) balanced {
	m.expireLocal()
	m.releaseFinished(ctx)

	opCtx, cancel := m.opContext(ctx)
	b, err := m.store.Balance(opCtx, m.group, m.cfg.MemberID, m.cfg.TTL, m.cfg.Partitions)
	cancel()
	others, active, paused := b.Others, b.Active, b.Paused
	if err != nil {
		if ctx.Err() == nil {
			m.logger.Error("Heartbeat failed", err, nil)
		}
		return balanced{}
	}
	result := balanced{othersExpireIn: b.OthersExpireIn}
	slices.Sort(others)
	sameGroup := m.seen.active == active && slices.Equal(m.seen.others, others)
	m.seen.active, m.seen.others = active, others
	target := share(active, m.cfg.MemberID, others)

	m.mu.Lock()
	for _, p := range paused {
		if l := m.leases[int(p)]; l != nil && l.state == stateActive {
			l.state = stateDraining
			l.cancel(errPaused)
			m.logger.Info("Releasing lease of paused partition", watermill.LogFields{"partition": l.partition, "token": l.token})
		}
	}
	var held []*Lease
	draining := 0
	for _, l := range m.leases {
		switch l.state {
		case stateActive:
			held = append(held, l)
		case stateDraining:
			draining++
		}
	}
	if surplus := len(held) - target; surplus > 0 {
		// Give back the highest partitions; any choice converges.
		sort.Slice(held, func(i, j int) bool { return held[i].partition > held[j].partition })
		for _, l := range held[:surplus] {
			l.state = stateDraining
			l.cancel(errRebalanced)
			m.logger.Info("Releasing lease to rebalance", watermill.LogFields{
				"partition": l.partition, "token": l.token, "share": target, "members": len(others) + 1,
			})
		}
		held = held[surplus:]
	}
	need := target - len(held) - draining
	exclude := make([]int32, 0, len(m.leases))
	for p := range m.leases {
		exclude = append(exclude, int32(p))
	}
	settledSoFar := sameGroup && len(paused) == 0 && len(held) == target && draining == 0 && len(m.leases) == target
	m.mu.Unlock()

	if need <= 0 {
		result.settled = settledSoFar
		return result
	}
	got := m.acquire(ctx, need, exclude)
	if len(got) == 0 {
		return result
	}
	if ctx.Err() != nil {
		// Stopping: leases the statement took as the stop came are not
		// handed to workers; shutdown gives them back at once.
		for _, l := range got {
			l.Done()
		}
		return result
	}
	parts := make([]int, len(got))
	for i, l := range got {
		parts[i] = l.partition
	}
	m.logger.Info("Acquired leases", watermill.LogFields{"partitions": parts, "share": target, "members": len(others) + 1})
	for _, l := range got {
		m.logger.Debug("Acquired lease", watermill.LogFields{"partition": l.partition, "token": l.token, "cursor": l.cursor})
		onAcquire(l)
	}
	return result
}

// share is this member's number of partitions: active/n for each of the n
// live members, plus one for the first active%n of them in id order.
func share(active int, me string, others []string) int {
	if active <= 0 {
		return 0
	}
	ids := append(slices.Clone(others), me)
	sort.Strings(ids)
	ids = slices.Compact(ids)
	n := len(ids)
	rank := sort.SearchStrings(ids, me)
	t := active / n
	if rank < active%n {
		t++
	}
	return t
}

func (m *Manager) acquire(ctx context.Context, need int, exclude []int32) []*Lease {
	sent := time.Now()
	// Not cancelled with ctx: the statement commits on its own, so one
	// cancelled after the server ran it would leave its leases taken and
	// unknown here, held by nobody until they expire (a Subscriber
	// closed as it started, a source removed from a pipeline.Fleet). It
	// finishes, bounded by TTL/2, and a stopping caller gives them back.
	opCtx, cancel := m.opContext(context.WithoutCancel(ctx))
	defer cancel()
	acquired, err := m.store.Acquire(opCtx, m.group, m.cfg.MemberID, m.cfg.Partitions, exclude, m.cfg.TTL, need)
	if err != nil {
		// The statement failed as a whole: nothing was acquired.
		if ctx.Err() == nil {
			m.logger.Error("Cannot acquire leases", err, nil)
		}
		return nil
	}
	got := make([]*Lease, 0, len(acquired))
	for _, a := range acquired {
		lctx, lcancel := context.WithCancelCause(context.WithoutCancel(ctx))
		got = append(got, &Lease{
			m: m, partition: int(a.Partition), token: a.Token, cursor: a.Cursor, attempts: int(a.Attempts),
			charged: int(a.Charged), suspectFrom: a.SuspectFrom, suspectTo: a.SuspectTo, unexplained: a.Unexplained, lastError: a.LastError, backoff: a.Backoff,
			ctx: lctx, cancel: lcancel, done: make(chan struct{}),
			state: stateActive, validUntil: sent.Add(m.cfg.TTL),
		})
	}
	m.mu.Lock()
	for _, l := range got {
		m.leases[l.partition] = l
	}
	m.mu.Unlock()
	return got
}

// renew extends every held lease in one statement and cancels the lost
// ones at once.
func (m *Manager) renew(ctx context.Context) {
	m.expireLocal()
	m.mu.Lock()
	var parts []int32
	var tokens []int64
	for p, l := range m.leases {
		if l.state == stateActive || l.state == stateDraining {
			parts = append(parts, int32(p))
			tokens = append(tokens, l.token)
		}
	}
	m.mu.Unlock()
	if len(parts) == 0 {
		return
	}
	sent := time.Now()
	opCtx, cancel := m.opContext(ctx)
	defer cancel()
	ok, err := m.store.Renew(opCtx, m.group, m.cfg.MemberID, parts, tokens, m.cfg.TTL) // partition -> renewed (false: locked, still valid)
	if err != nil {
		if ctx.Err() == nil {
			m.logger.Error("Cannot renew leases", err, nil)
		}
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, p := range parts {
		l := m.leases[int(p)]
		if l == nil || l.token != tokens[i] || (l.state != stateActive && l.state != stateDraining) {
			continue
		}
		renewed, found := ok[p]
		switch {
		case !found:
			m.lostLocked(l, fmt.Errorf("%w: partition %d (token %d) could not be renewed: expired or taken over", ErrLeaseLost, l.partition, l.token))
		case renewed:
			l.validUntil = sent.Add(m.cfg.TTL)
		}
	}
}

// expireLocal treats leases not renewed within TTL, by the local clock, as
// lost: the server may already have given them to another member.
func (m *Manager) expireLocal() {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.leases {
		if (l.state == stateActive || l.state == stateDraining) && !now.Before(l.validUntil) {
			m.lostLocked(l, fmt.Errorf("%w: partition %d (token %d) not renewed within %v", ErrLeaseLost, l.partition, l.token, m.cfg.TTL))
		}
	}
}

func (m *Manager) markLost(l *Lease, cause error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lostLocked(l, cause)
}

func (m *Manager) lostLocked(l *Lease, cause error) {
	if l.state == stateActive || l.state == stateDraining {
		l.state = stateLost
		m.logger.Info("Lease lost", watermill.LogFields{"partition": l.partition, "token": l.token, "reason": cause.Error()})
	}
	l.cancel(cause)
}

// releaseFinished releases, in one statement, the leases whose worker called
// Done. Lost ones are included: the release is
// fenced by owner and token, so it only frees a lease still ours.
func (m *Manager) releaseFinished(ctx context.Context) {
	m.mu.Lock()
	var ls []*Lease
	var parts []int32
	var tokens []int64
	for p, l := range m.leases {
		if l.isDone() {
			if l.state == stateActive {
				// The worker stopped on its own: give the partition back.
				l.cancel(errWorkerDone)
			}
			l.state = stateReleasing
			ls = append(ls, l)
			parts = append(parts, int32(p))
			tokens = append(tokens, l.token)
		}
	}
	m.mu.Unlock()
	if len(ls) == 0 {
		return
	}
	opCtx, cancel := m.opContext(ctx)
	defer cancel()
	released, err := m.release(opCtx, parts, tokens)
	if err != nil {
		// Kept in stateReleasing and retried; meanwhile they expire.
		if ctx.Err() == nil {
			m.logger.Error("Cannot release leases", err, watermill.LogFields{"partitions": parts})
		}
		return
	}
	var done, again []int32
	m.mu.Lock()
	for _, l := range ls {
		if !released[int32(l.partition)] {
			again = append(again, int32(l.partition))
			continue
		}
		done = append(done, int32(l.partition))
		if m.leases[l.partition] == l {
			delete(m.leases, l.partition)
		}
	}
	m.mu.Unlock()
	if len(done) > 0 {
		m.logger.Info("Released leases", watermill.LogFields{"partitions": done})
	}
	if len(again) > 0 {
		m.logger.Debug("Lease rows locked by a transaction: released again shortly", watermill.LogFields{"partitions": again})
	}
}

// release gives back the leases of parts (with their tokens) and returns
// the partitions that are no longer this member's: released now, or
// lost before (another member's, or expired). A partition missing from
// the result is still held, its row locked by a transaction when the
// release came (a statement of its worker finishing): it is released
// again, rather than left to hold the partition until it expires.
func (m *Manager) release(ctx context.Context, parts []int32, tokens []int64) (map[int32]bool, error) {
	freed, err := m.store.Release(ctx, m.group, m.cfg.MemberID, parts, tokens)
	if err != nil {
		return nil, err
	}
	gone := make(map[int32]bool, len(parts))
	for _, p := range parts {
		gone[p] = true
	}
	if len(freed) == len(parts) {
		return gone, nil
	}
	held, err := m.store.StillHeld(ctx, m.group, m.cfg.MemberID, parts, tokens)
	if err != nil {
		return nil, err
	}
	for _, p := range held {
		if !slices.Contains(freed, p) {
			delete(gone, p)
		}
	}
	return gone, nil
}

// releaseRetry is how soon shutdown tries again a release that found its
// row locked.
const releaseRetry = 50 * time.Millisecond

// shutdown ends every lease, waits up to TTL for the workers, releases the
// leases and removes the member.
func (m *Manager) shutdown(parent context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), 2*m.cfg.TTL)
	defer cancel()
	m.mu.Lock()
	for _, l := range m.leases {
		if l.state == stateActive {
			l.state = stateDraining
		}
		l.cancel(errStopped)
	}
	m.mu.Unlock()

	deadline := time.NewTimer(m.cfg.TTL)
	defer deadline.Stop()
	renew := time.NewTicker(m.cfg.RenewInterval)
	defer renew.Stop()
	// A release whose row was locked is tried again soon: its partition
	// must not wait out the lease.
	retry := time.NewTicker(releaseRetry)
	defer retry.Stop()
wait:
	for {
		m.releaseFinished(ctx)
		m.mu.Lock()
		left := len(m.leases)
		m.mu.Unlock()
		if left == 0 {
			break
		}
		// Whichever woke the loop, what fell due meanwhile is handled in a
		// fixed order: the same timers firing at once take the same path
		// every time (the simulator replays a seed call for call).
		var renewDue, timedOut bool
		select {
		case <-m.wake:
		case <-retry.C:
		case <-renew.C:
			renewDue = true
		case <-deadline.C:
			timedOut = true
		}
		select {
		case <-deadline.C:
			timedOut = true
		default:
		}
		select {
		case <-renew.C:
			renewDue = true
		default:
		}
		select {
		case <-retry.C:
		default:
		}
		if timedOut {
			break wait
		}
		if renewDue {
			m.renew(ctx)
		}
	}

	m.mu.Lock()
	if len(m.leases) > 0 {
		var parts []int
		for p := range m.leases {
			parts = append(parts, p)
		}
		sort.Ints(parts)
		m.logger.Error("Leases not released: their workers did not call Done in time; they will expire",
			nil, watermill.LogFields{"partitions": parts})
		clear(m.leases)
	}
	m.mu.Unlock()

	opCtx, opCancel := m.opContext(ctx)
	defer opCancel()
	if err := m.store.Leave(opCtx, m.group, m.cfg.MemberID); err != nil {
		m.logger.Error("Cannot remove member", err, nil)
	}
}

// Step is one round of Run's loop, run by a caller that drives delivery
// itself in its own goroutine (outboxtest's synchronous runner): it
// creates the cursor rows on its first call, renews the leases held,
// heartbeats, releases those whose worker called Done, and acquires this
// member's share of the free partitions (every partition when it is the
// only live member). It starts no goroutine. It returns the leases it
// acquired; the caller runs their workers and calls Done on each when it
// stops using it, and Stop at the end.
func (m *Manager) Step(ctx context.Context) ([]*Lease, error) {
	if !m.stepped {
		if err := m.start(ctx); err != nil {
			return nil, err
		}
		m.stepped = true
	}
	m.renew(ctx)
	var got []*Lease
	m.balance(ctx, func(l *Lease) { got = append(got, l) })
	return got, nil
}

// Stop ends what Step started: every lease is cancelled, those whose
// worker called Done are released (the others expire), and the member
// leaves the group.
func (m *Manager) Stop(ctx context.Context) {
	m.shutdown(ctx)
}
