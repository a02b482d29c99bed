// Package notifier shares one LISTEN connection per connection pool among
// everything in the process that waits for PostgreSQL notifications: the
// Sequencer (woken by publishers) and every Subscriber (woken by the
// sequencer), of every schema on that pool. Before it, each of them held a
// connection of its own.
//
// [Listen] registers a callback for a channel and returns a
// [Subscription]. The first subscription on a pool starts the pool's
// listener: a goroutine that takes one connection out of the pool (hijacked:
// it never goes back holding a LISTEN), issues LISTEN for every channel
// wanted, and fans each notification's payload out to that channel's
// callbacks. Subscribing to a new channel, or dropping the last
// subscription of one, interrupts the wait to LISTEN or UNLISTEN on the
// live connection. When the last subscription of the pool goes, the
// listener closes its connection and ends; Unlisten waits for that.
//
// The listener has the lifecycle of every long-running component
// (internal/startstop): started once, by the pool's first subscription,
// and closed by its last, which waits for it.
//
// A lost connection is re-established with the shared backoff
// (internal/backoff: 50–100 ms after the first loss, doubling to 2.5–5 s;
// a connection that held for longer than the longest wait resets it),
// every channel is listened to again, and every callback is called with
// payload "": notifications may have been missed, re-poll. The same ""
// call follows the first LISTEN of each subscription, so a subscriber
// never misses what happened before it listened. [Subscription.Live] tells
// whether the channel is listened to on a live connection now: a caller
// stretches its safety-net poll only while it is (the Sequencer does).
//
// Callbacks run on the listener's goroutine and must not block: they
// should only record the wake-up (a non-blocking send on a buffered
// channel, a poke), as the outbox's do. A slow callback delays every other
// subscriber of the pool.
package notifier

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/startstop"
)

// Subscription is one callback registered with Listen.
type Subscription struct {
	l       *listener
	channel string
	fn      func(payload string)
	once    sync.Once
}

// Live reports whether the subscription's channel is listened to on a
// live connection now: a notification sent on it would reach fn. It is
// false before the first LISTEN, and from the loss of the connection until
// it is re-established and the channel listened to again (fn then gets its
// ""). A caller that stretches its safety-net poll while notifications
// arrive checks it: while it is false, nothing announces new work.
func (s *Subscription) Live() bool {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	return s.l.live[s.channel]
}

// Unlisten removes the subscription. When it was the pool's last, the
// listener's connection is closed and its goroutine has ended when
// Unlisten returns.
func (s *Subscription) Unlisten() {
	s.once.Do(func() { s.l.remove(s) })
}

var (
	registryMu sync.Mutex
	registry   = map[*pgxpool.Pool]*listener{}
)

// Listen calls fn with the payload of every notification on channel,
// received on the pool's shared LISTEN connection, until the subscription
// is removed. fn is also called with "" once the channel is listened to,
// and after every reconnect. logger reports lost connections (nil: none).
func Listen(pool *pgxpool.Pool, channel string, logger watermill.LoggerAdapter, fn func(payload string)) *Subscription {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	l := registry[pool]
	if l == nil {
		l = newListener(pool, logger)
		registry[pool] = l
	}
	s := &Subscription{l: l, channel: channel, fn: fn}
	l.add(s)
	return s
}

// listener is the shared LISTEN connection of one pool.
type listener struct {
	pool   *pgxpool.Pool
	logger watermill.LoggerAdapter

	mu      sync.Mutex
	subs    map[string]map[*Subscription]struct{} // channel -> subscriptions
	fresh   []*Subscription                       // added since the last sync: owed a "" call
	live    map[string]bool                       // channels listened to on the live connection
	changed chan struct{}                         // a channel was added or dropped (capacity 1)

	life startstop.Service
}

func newListener(pool *pgxpool.Pool, logger watermill.LoggerAdapter) *listener {
	l := &listener{
		pool:    pool,
		logger:  logger.With(watermill.LogFields{"component": "outbox.notifier"}),
		subs:    map[string]map[*Subscription]struct{}{},
		live:    map[string]bool{},
		changed: make(chan struct{}, 1),
	}
	l.life.Name = "notifier.listener"
	_ = l.life.Start(context.Background(), l.run) // (a new Service: it cannot fail)
	return l
}

// add is called with registryMu held.
func (l *listener) add(s *Subscription) {
	l.mu.Lock()
	if l.subs[s.channel] == nil {
		l.subs[s.channel] = map[*Subscription]struct{}{}
	}
	l.subs[s.channel][s] = struct{}{}
	l.fresh = append(l.fresh, s)
	l.mu.Unlock()
	l.signal()
}

func (l *listener) remove(s *Subscription) {
	registryMu.Lock()
	l.mu.Lock()
	delete(l.subs[s.channel], s)
	if len(l.subs[s.channel]) == 0 {
		delete(l.subs, s.channel)
	}
	last := len(l.subs) == 0
	l.mu.Unlock()
	if last {
		delete(registry, l.pool)
	}
	registryMu.Unlock()
	if last {
		l.life.Close()
		return
	}
	l.signal()
}

func (l *listener) signal() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// heldLongEnough is how long a connection must have held for its loss to
// start a new streak of failures: longer than the longest wait
// (export_test.go shortens it).
var heldLongEnough = backoff.Default.Max

// run holds the pool's LISTEN connection, and reconnects, until ctx ends.
func (l *listener) run(ctx context.Context) {
	var failures backoff.Streak // backoff.Default
	for ctx.Err() == nil {
		started := time.Now()
		err := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > heldLongEnough {
			// It held: a loss now is not one of a streak (a connection
			// killed as soon as it is made keeps backing off).
			failures.Succeeded()
		}
		wait := failures.Failed()
		l.logger.Error("LISTEN connection lost, reconnecting", err, watermill.LogFields{"attempt": failures.Failures(), "retry_in": wait})
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// session holds one connection until it fails or ctx ends.
func (l *listener) session(ctx context.Context) error {
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // carries LISTENs: never back to the pool
	defer conn.Close(context.Background())
	defer func() { // nothing is listened to until the next session's LISTENs
		l.mu.Lock()
		clear(l.live)
		l.mu.Unlock()
	}()
	listening := map[string]bool{}
	l.mu.Lock()
	// Everyone subscribed now gets a "" after this session's LISTENs.
	l.fresh = l.fresh[:0]
	for _, subs := range l.subs {
		for s := range subs {
			l.fresh = append(l.fresh, s)
		}
	}
	l.mu.Unlock()
	for {
		if err := l.sync(ctx, conn, listening); err != nil {
			return err
		}
		waitCtx, stopWait := context.WithCancel(ctx)
		interrupted, exited := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(exited)
			select {
			case <-l.changed:
				close(interrupted)
				stopWait()
			case <-waitCtx.Done():
			}
		}()
		n, err := conn.WaitForNotification(waitCtx)
		stopWait()
		<-exited // so that interrupted is settled
		if err != nil {
			select {
			case <-interrupted:
				if conn.IsClosed() {
					return errors.New("the connection closed while interrupting its wait")
				}
				continue // channels changed: sync, then wait again
			default:
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		select {
		case <-interrupted:
			l.signal() // the change still needs its sync
		default:
		}
		l.deliver(n.Channel, n.Payload)
	}
}

// sync issues LISTEN and UNLISTEN so that conn listens to exactly the
// channels subscribed to, then calls the callbacks owed a "".
func (l *listener) sync(ctx context.Context, conn *pgx.Conn, listening map[string]bool) error {
	l.mu.Lock()
	var add, drop []string
	for ch := range l.subs {
		if !listening[ch] {
			add = append(add, ch)
		}
	}
	for ch := range listening {
		if l.subs[ch] == nil {
			drop = append(drop, ch)
		}
	}
	l.mu.Unlock()
	for _, ch := range add {
		if _, err := conn.Exec(ctx, dbsql.Listen(ch)); err != nil {
			return err
		}
		listening[ch] = true
	}
	for _, ch := range drop {
		if _, err := conn.Exec(ctx, dbsql.Unlisten(ch)); err != nil {
			return err
		}
		delete(listening, ch)
	}
	l.mu.Lock()
	clear(l.live)
	for ch := range listening {
		l.live[ch] = true
	}
	owed := l.fresh
	l.fresh = nil
	var live []*Subscription
	for _, s := range owed {
		if _, ok := l.subs[s.channel][s]; ok && listening[s.channel] {
			live = append(live, s)
		}
	}
	l.mu.Unlock()
	for _, s := range live {
		s.fn("")
	}
	return nil
}

func (l *listener) deliver(channel, payload string) {
	l.mu.Lock()
	fns := make([]func(string), 0, len(l.subs[channel]))
	for s := range l.subs[channel] {
		fns = append(fns, s.fn)
	}
	l.mu.Unlock()
	for _, fn := range fns {
		fn(payload)
	}
}
