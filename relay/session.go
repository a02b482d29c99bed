package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/pgrepl"
	"github.com/millrace/watermill-outbox/internal/relaydriver"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/internal/walrecord"
)

// session is one stream of the slot: a reader goroutine decodes whole
// transactions, the appender appends them in batches.
type session struct {
	r    *Relay
	conn relaydriver.Stream
	// db is the append connection (Relay.appendName).
	db relaydriver.Conn
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

	// held are the keys whose messages wait in pending behind a delayed
	// one (delay.go), as read at heldRead and routed since.
	held     map[topicKey]struct{}
	heldRead time.Time
	// forwardOnly are the forwarder-only topics (outbox.ForwardOnly),
	// read when the session starts and again when an append finds one it
	// did not know (the log statements refuse their messages): the relay
	// puts all their messages into pending, where their forwarder reads
	// them, never into the log.
	forwardOnly map[string]struct{}
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
// then, paced by a wait that follows the load (tune.FollowLoad of
// MinAppendInterval and the previous append's messages), takes every one
// decoded until that wait since the previous append's start is over (up
// to MaxBatch messages), and appends them in one database transaction.
func (s *session) appendLoop(ctx context.Context) error {
	var (
		batch    []txn
		lastFrom time.Time // when the previous append started
		// gap follows the load (tune.FollowLoad): how long after the
		// previous append's start the next may start, short after an
		// append of a message or two, MinAppendInterval after a large one.
		gap = tune.FollowLoad(s.r.cfg.MinAppendInterval, 0)
	)
	pace := time.NewTimer(time.Hour)
	pace.Stop()
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
		var due <-chan time.Time
		if wait := time.Until(lastFrom.Add(gap)); wait > 0 {
			pace.Reset(wait)
			due = pace.C
		}
	more:
		for n < s.r.cfg.MaxBatch {
			var (
				t  txn
				ok bool
			)
			if due == nil { // take only what is waiting
				select {
				case t, ok = <-s.txns:
				default:
					break more
				}
			} else { // wait for more until the pace is due
				// A transaction already decoded goes first (a fixed order
				// when the pace falls due too: the simulator replays).
				select {
				case t, ok = <-s.txns:
				default:
					select {
					case t, ok = <-s.txns:
					case <-due:
						due = nil
						continue
					case <-ctx.Done():
						return nil
					}
				}
			}
			if !ok {
				break more
			}
			batch = append(batch, t)
			n += len(t.msgs)
		}
		pace.Stop() // since Go 1.23 no stale tick is left to drain
		lastFrom = time.Now()
		if err := s.appendNamed(ctx, batch, n); err != nil {
			return err
		}
		gap = tune.FollowLoad(s.r.cfg.MinAppendInterval, n)
		s.r.pace.Store(int64(gap))
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
	total := n
	batch, delayed, err := s.route(ctx, batch)
	if err != nil {
		return err
	}
	n -= len(delayed)
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
	if n == 0 {
		// Every message goes into pending (forwarder-only topics, delays):
		// one statement.
		if err := s.appendPending(ctx, delayed, newPos); err != nil {
			return err
		}
		s.count(batch, total, started, oldest)
		return nil
	}
	if large == 0 && n <= smallAppend && len(delayed) == 0 {
		if err := s.appendSmall(ctx, batch, n, channel, newPos); err != nil {
			return err
		}
		s.count(batch, total, started, oldest)
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
	if len(delayed) > 0 {
		exec := func(ctx context.Context, sql string, args ...any) error {
			_, err := tx.Exec(ctx, sql, args...)
			return err
		}
		if err := s.insertRouted(ctx, exec, delayed); err != nil {
			return err
		}
		if ch := s.pendingChannel(delayed); ch != nil {
			if err := exec(ctx, s.r.q.PendingNotify, *ch, names.RelayedPayload); err != nil {
				return fmt.Errorf("relay: wake the forwarders of forwarder-only topics: %w", err)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("relay: commit the append of %d messages: %w", n, err)
	}
	s.count(batch, total, started, oldest)
	return nil
}

// count adds an append to the Relay's totals and metrics.
func (s *session) count(batch []txn, n int, started time.Time, oldest map[string]time.Duration) {
	s.r.appended.Add(int64(n))
	s.r.transactions.Add(int64(len(batch)))
	s.r.appends.Add(1)
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
	return fmt.Errorf("%w: %s (was a topic dropped? outbox.RegisterTopic registers it again); none of the append's %d messages was appended, and the relay retries", errNotRegistered, partitions, n)
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
	ended, err := r.backend.EndStaleAppenders(ctx, r.appendName())
	if err != nil {
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
