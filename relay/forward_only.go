package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgrepl"
)

// Forwarder-only topics (outbox.ForwardOnly) in the log-based mode: their
// only reader is a Forwarder, which reads a forwarder-only topic's
// messages from pending and removes them in the transaction that records
// them forwarded. The relay puts every message of such a topic into
// pending, in commit order (so in id order), and never into the log: a
// batch of only such messages is one statement (WALAppendPending). The
// statements that append to the log refuse a forwarder-only topic's
// partitions, so a relay that has not read a topic registered since it
// started cannot put its messages where nobody reads them: the append
// fails as for an unregistered partition, the relay reads the topics
// again and appends once more.

// errNotRegistered: an append named partitions that are not registered,
// or whose topic is forwarder-only; nothing was appended.
var errNotRegistered = errors.New("relay: topic partitions not registered")

// readForwardOnly reads the forwarder-only topics when the session has not
// yet, or again when again is set, and reports whether the set grew.
func (s *session) readForwardOnly(ctx context.Context, again bool) (bool, error) {
	if s.forwardOnly != nil && !again {
		return false, nil
	}
	rows, err := s.db.Query(ctx, s.r.q.TopicsForwardOnlyNames)
	if err != nil {
		return false, fmt.Errorf("relay: read the forwarder-only topics: %w", err)
	}
	defer rows.Close()
	topics := map[string]struct{}{}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return false, err
		}
		topics[t] = struct{}{}
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("relay: read the forwarder-only topics: %w", err)
	}
	grew := false
	for t := range topics {
		if _, ok := s.forwardOnly[t]; !ok {
			grew = true
		}
	}
	s.forwardOnly = topics
	return grew, nil
}

// appendNamed appends batch (n messages); when the append names partitions
// the log refuses and the forwarder-only topics read again are more than
// before (one was registered since), it appends once more, so that their
// messages go into pending.
func (s *session) appendNamed(ctx context.Context, batch []txn, n int) error {
	err := s.append(ctx, batch, n)
	if !errors.Is(err, errNotRegistered) {
		return err
	}
	grew, rerr := s.readForwardOnly(ctx, true)
	if rerr != nil || !grew {
		return err
	}
	return s.append(ctx, batch, n)
}

// pendingChannel is the channel that wakes the forwarders when rs holds a
// forwarder-only topic's message and notifications are on, else nil.
func (s *session) pendingChannel(rs []routed) *string {
	if s.r.cfg.DisableNotify {
		return nil
	}
	for _, r := range rs {
		if r.forwardOnly {
			c := names.PendingChannel(s.r.cfg.Schema)
			return &c
		}
	}
	return nil
}

// appendPending appends a batch whose messages (rs) all go into pending,
// with WALAppendPending: one statement.
func (s *session) appendPending(ctx context.Context, rs []routed, newPos pgrepl.LSN) error {
	args := append([]any{s.r.slot, int64(s.pos), int64(newPos)}, pendingArgs(rs)...)
	args = append(args, s.pendingChannel(rs), names.RelayedPayload)
	var moved, inserted int64
	var notified *int64
	err := s.db.QueryRow(ctx, s.r.q.WALAppendPending, args...).Scan(&moved, &inserted, &notified)
	switch {
	case err == nil:
	case isLockTimeout(err):
		return s.r.endStaleAppenders(ctx, err)
	default:
		return fmt.Errorf("relay: put %d messages into pending: %w", len(rs), err)
	}
	if moved != 1 {
		return errFenced
	}
	return nil
}
