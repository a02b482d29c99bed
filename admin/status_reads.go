package admin

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/dbsql"
)

// The reads Status makes in its one snapshot transaction, one per table or
// view: topics, partitions with their cursors, members, lease holders,
// held keys, the messages still waiting for the sequencer, and the
// log-based mode's slot. Status (status.go) assembles them.

// addUnsequenced adds each topic's committed messages that wait for the
// sequencer to the Lag of its groups with cursors, and the oldest one's age
// to their MaxLagSeconds: without a sequencer they pile up there while the
// partitions show no lag. Delayed messages whose time has not come, and
// the later messages of their keys, are not late: they are left out, and
// the topic's Delayed and NextDueAt say how many and until when.
func (a *Admin) addUnsequenced(ctx context.Context, tx pgx.Tx, topics []TopicStatus) error {
	rows, err := tx.Query(ctx, a.q.PendingMetrics)
	if err != nil {
		return err
	}
	type waiting struct {
		ready, delayed, behind int64
		age                    float64
		next                   *time.Time
	}
	byTopic := map[string]waiting{}
	var (
		topic              string
		n, delayed, notYet int64
		age                float64
		next               *time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&topic, &n, &age, &delayed, &notYet, &next}, func() error {
		byTopic[topic] = waiting{ready: n - notYet, delayed: delayed, behind: max(notYet-delayed, 0), age: age, next: next}
		return nil
	}); err != nil {
		return err
	}
	for ti := range topics {
		t := &topics[ti]
		w := byTopic[t.Topic]
		t.Delayed, t.NextDueAt, t.BehindDelayed = w.delayed, w.next, w.behind
		for gi := range t.Groups {
			if g := &t.Groups[gi]; len(g.Partitions) > 0 {
				g.Lag += w.ready
				g.MaxLagSeconds = max(g.MaxLagSeconds, w.age)
			}
		}
	}
	return nil
}

// walSlot reads the schema's replication slot, if it has one.
func (a *Admin) walSlot(ctx context.Context, tx pgx.Tx) (*WALSlot, error) {
	slot := dbsql.WALName(a.cfg.Schema)
	w := WALSlot{Slot: slot}
	var confirmed, appended int64
	err := tx.QueryRow(ctx, a.q.WALSlotStatus, slot).Scan(&w.Active, &w.RetainedWALBytes, &confirmed, &w.WALStatus, &appended)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if w.Active {
		err := tx.QueryRow(ctx, a.q.WALSlotHolder, slot).Scan(&w.ActivePID, &w.ActiveInstance)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) { // (dropped meanwhile)
			return nil, err
		}
	}
	return &w, nil
}

// held adds the held keys to the partitions they are held in (parts is
// ordered by topic, group, partition).
func (a *Admin) held(ctx context.Context, tx pgx.Tx, f Filter, parts []PartitionStatus) error {
	rows, err := tx.Query(ctx, a.q.HeldStatus, f.Group, f.Topic)
	if err != nil {
		return err
	}
	defer rows.Close()
	type where struct {
		group, topic string
		partition    int
	}
	index := make(map[where]int, len(parts))
	for i, p := range parts {
		index[where{p.Group, p.Topic, p.Partition}] = i
	}
	for rows.Next() {
		var (
			at where
			k  HeldKey
		)
		if err := rows.Scan(&at.group, &at.topic, &at.partition, &k.Keyless, &k.Key, &k.HeadSeq, &k.Messages,
			&k.Attempts, &k.LastError, &k.FirstFailure, &k.RetryAt, &k.HeldAt, &k.Requested); err != nil {
			return err
		}
		if i, ok := index[at]; ok {
			parts[i].HeldKeys = append(parts[i].HeldKeys, k)
			parts[i].HeldMessages += k.Messages
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range parts {
		slices.SortFunc(parts[i].HeldKeys, func(a, b HeldKey) int { return cmp.Compare(a.HeadSeq, b.HeadSeq) })
	}
	return nil
}

type memberRow struct {
	group, topic string
	live         bool
	MemberStatus
}

// members reads the member rows of the selected groups and topics, live
// or not.
func (a *Admin) members(ctx context.Context, tx pgx.Tx, f Filter) ([]memberRow, error) {
	rows, err := tx.Query(ctx, a.q.MembersStatus, f.Group, f.Topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []memberRow
	for rows.Next() {
		var m memberRow
		if err := rows.Scan(&m.group, &m.topic, &m.MemberID, &m.JoinedAt, &m.HeartbeatAt, &m.CanReject, &m.live); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

type holderRow struct {
	topic, group string
	partitions   []int32
}

// holders reads, over every group of the selected topics (whatever
// f.Group), the groups whose cursor is the lowest in a partition with
// messages left after it, the biggest holder of each topic first.
func (a *Admin) holders(ctx context.Context, tx pgx.Tx, f Filter) ([]holderRow, error) {
	rows, err := tx.Query(ctx, a.q.CursorsStatusHolders, f.Topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []holderRow
	for rows.Next() {
		var h holderRow
		if err := rows.Scan(&h.topic, &h.group, &h.partitions); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// addHolders marks the groups and partitions that hold retention back, and
// each topic's biggest holder.
func addHolders(topics []TopicStatus, holders []holderRow) {
	for ti := range topics {
		t := &topics[ti]
		for _, h := range holders {
			if h.topic != t.Topic {
				continue
			}
			if t.RetentionHeldBy == "" {
				t.RetentionHeldBy = h.group // the first is the biggest
			}
			for gi := range t.Groups {
				g := &t.Groups[gi]
				if g.Group != h.group {
					continue
				}
				g.HoldsRetention = true
				for pi := range g.Partitions {
					if slices.Contains(h.partitions, int32(g.Partitions[pi].Partition)) {
						g.Partitions[pi].HoldsRetention = true
					}
				}
			}
		}
	}
}

func (a *Admin) topics(ctx context.Context, tx pgx.Tx, f Filter) ([]TopicStatus, error) {
	rows, err := tx.Query(ctx, a.q.TopicsStatus, f.Topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TopicStatus
	for rows.Next() {
		var t TopicStatus
		if err := rows.Scan(&t.Topic, &t.Partitions, &t.Sequenced, &t.Unsequenced, &t.ForwardOnly); err != nil {
			return nil, err
		}
		t.Groups = []GroupStatus{}
		out = append(out, t)
	}
	return out, rows.Err()
}

func (a *Admin) partitions(ctx context.Context, tx pgx.Tx, f Filter, now time.Time) ([]PartitionStatus, error) {
	rows, err := tx.Query(ctx, a.q.CursorsStatus, f.Group, f.Topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []PartitionStatus
	for rows.Next() {
		var p PartitionStatus
		var inflight bool
		if err := rows.Scan(&p.Group, &p.Topic, &p.Partition, &p.HeadSeq, &p.Cursor, &p.OldestUnprocessedAt,
			&p.FirstRetainedSeq, &p.LeaseOwner, &p.LeaseExpiresAt, &p.Leased, &p.LeaseToken, &p.Paused,
			&p.AdaptiveState, &p.BatchSize, &p.Attempts, &p.LastError, &p.LastErrorAt, &p.UpdatedAt, &p.Deliveries,
			&p.BackoffUntil, &p.DeadLetters, &p.ScanSeq, &p.IsolationFullSince, &inflight, &p.Suspects); err != nil {
			return nil, err
		}
		p.Lag = max(p.HeadSeq-p.Cursor, 0)
		if p.Lag == 0 {
			p.OldestUnprocessedAt = nil
		}
		if p.OldestUnprocessedAt != nil {
			p.LagSeconds = max(now.Sub(*p.OldestUnprocessedAt).Seconds(), 0)
		}
		p.BackingOff = p.BackoffUntil != nil && p.BackoffUntil.After(now)
		if !p.Leased && inflight {
			p.Unanswered = 1
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
