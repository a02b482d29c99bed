package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/millrace/watermill-outbox/internal/walrecord"
)

// Delayed delivery in the log-based mode (outbox.DeliverAt): the relay
// appends a message to the log at once unless its time has not come or an
// earlier message of its key waits. Those go into pending instead, marked
// as holding their key back (holds), and the Sequencer moves them when
// they are due, in their order: so a schema that publishes delayed
// messages in ModeWAL needs a Sequencer too (a pipeline's, unless
// DisableSequencer). The keys that wait are known from pending's holding
// rows, read before an append while some wait, and at most once a second
// otherwise.

// heldRefresh bounds how long the relay trusts that no key waits before it
// reads pending's holding rows again (delayed messages published in the
// table mode are seen there).
const heldRefresh = time.Second

// topicKey is a message's key in its topic.
type topicKey struct{ topic, key string }

// routed is a message the relay puts into pending rather than the log.
type routed struct {
	msg        walrecord.Message
	commitTime time.Time
	deliverAt  *time.Time
	holds      bool
	// forwardOnly: of a forwarder-only topic (its forwarder takes it
	// from pending; the Sequencer leaves it there).
	forwardOnly bool
}

// delayOf reads a message's delivery time and whether it is unordered from
// its metadata (JSON), without decoding what carries neither.
func delayOf(metadata string) (at *time.Time, unordered bool) {
	if !strings.Contains(metadata, `"outbox_deliver_at"`) && !strings.Contains(metadata, `"outbox_unordered"`) {
		return nil, false
	}
	var md map[string]string
	if err := json.Unmarshal([]byte(metadata), &md); err != nil {
		return nil, false
	}
	if v := md["outbox_deliver_at"]; v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			at = &t
		}
	}
	_, unordered = md["outbox_unordered"]
	return at, unordered
}

// route splits batch: the messages that go into the log now (the txns,
// each with what is left of its messages) and those that go into pending:
// every message of a forwarder-only topic, and the others that must wait.
func (s *session) route(ctx context.Context, batch []txn) ([]txn, []routed, error) {
	if err := s.refreshHeld(ctx); err != nil {
		return nil, nil, err
	}
	if _, err := s.readForwardOnly(ctx, false); err != nil {
		return nil, nil, err
	}
	now := time.Now()
	var out []routed
	kept := batch
	waited := false
	for i, t := range batch {
		var msgs []walrecord.Message
		for j, m := range t.msgs {
			at, unordered := delayOf(m.Metadata)
			if at != nil && !at.After(now) {
				at = nil // due already
			}
			ordered := m.Key != "" && !unordered
			k := topicKey{m.Topic, m.Key}
			_, held := s.held[k]
			_, forwardOnly := s.forwardOnly[m.Topic]
			if !forwardOnly && at == nil && !(ordered && held) {
				if msgs != nil {
					msgs = append(msgs, m)
				}
				continue
			}
			if msgs == nil { // the first routed message of this txn: copy what came before
				if out == nil {
					kept = append([]txn(nil), batch...)
				}
				msgs = append(make([]walrecord.Message, 0, len(t.msgs)), t.msgs[:j]...)
			}
			r := routed{msg: m, commitTime: t.commitTime, deliverAt: at, holds: ordered, forwardOnly: forwardOnly}
			if forwardOnly {
				// Its forwarder reads pending in id order, which is commit
				// order here; a delayed one holds its key back there as a
				// table-mode Publisher's does.
				r.holds = ordered && at != nil
			} else {
				waited = true
				if ordered {
					s.held[k] = struct{}{}
				}
			}
			out = append(out, r)
		}
		if msgs != nil {
			kept[i].msgs = msgs
		}
	}
	if waited && s.r.toldDelayed.CompareAndSwap(false, true) {
		s.r.logger.Info("Delayed messages (outbox.DeliverAt) wait in pending for a Sequencer to move them when due: one must run on this schema (a pipeline without DisableSequencer); outbox status shows them", nil)
	}
	return kept, out, nil
}

// refreshHeld reads the keys that wait in pending: before every append
// while some do, else at most every heldRefresh.
func (s *session) refreshHeld(ctx context.Context) error {
	if s.held != nil && len(s.held) == 0 && time.Since(s.heldRead) < heldRefresh {
		return nil
	}
	rows, err := s.db.Query(ctx, s.r.q.PendingHeldKeys)
	if err != nil {
		return fmt.Errorf("relay: read the keys that wait for delayed messages: %w", err)
	}
	defer rows.Close()
	held := map[topicKey]struct{}{}
	for rows.Next() {
		var k topicKey
		if err := rows.Scan(&k.topic, &k.key); err != nil {
			return err
		}
		held[k] = struct{}{}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("relay: read the keys that wait for delayed messages: %w", err)
	}
	s.held, s.heldRead = held, time.Now()
	return nil
}

// insertRouted writes the routed messages into pending, in the append's
// transaction.
func (s *session) insertRouted(ctx context.Context, exec func(ctx context.Context, sql string, args ...any) error, rs []routed) error {
	if err := exec(ctx, s.r.q.PendingInsertRelayed, pendingArgs(rs)...); err != nil {
		return fmt.Errorf("relay: put %d delayed messages into pending: %w", len(rs), err)
	}
	return nil
}

// pendingArgs are the arrays PendingInsertRelayed and WALAppendPending
// take of rs: topics, partitions, keys (empty: none), uuids, metadata,
// payloads, commit times, delivery times and whether each holds its key.
func pendingArgs(rs []routed) []any {
	n := len(rs)
	topics, parts, keys := make([]string, n), make([]int32, n), make([]string, n)
	uuids, metadata, payloads := make([]string, n), make([]string, n), make([][]byte, n)
	times, due, holds := make([]time.Time, n), make([]*time.Time, n), make([]bool, n)
	for i, r := range rs {
		topics[i], parts[i], keys[i] = r.msg.Topic, r.msg.Partition, r.msg.Key
		uuids[i], metadata[i], payloads[i] = r.msg.UUID, r.msg.Metadata, r.msg.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		times[i], due[i], holds[i] = r.commitTime, r.deliverAt, r.holds
	}
	return []any{topics, parts, keys, uuids, metadata, payloads, times, due, holds}
}
