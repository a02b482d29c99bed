package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Filter selects what Status reports. Zero fields select everything.
type Filter struct {
	Group string `json:"group,omitempty"`
	Topic string `json:"topic,omitempty"`
}

// Report is the status of the outbox, read in one snapshot.
type Report struct {
	// At is the database clock when the snapshot was taken; ages are
	// measured from it.
	At     time.Time     `json:"at"`
	Topics []TopicStatus `json:"topics"`
}

// TopicStatus is the status of one topic and the groups consuming it.
type TopicStatus struct {
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
	// Sequenced is how many messages were ever sequenced (the sum of the
	// partitions' head seqs); Unsequenced how many committed messages wait
	// for the sequencer.
	Sequenced   int64 `json:"sequenced"`
	Unsequenced int64 `json:"unsequenced"`
	// RetentionHeldBy is the group that holds the retention vacuum back
	// most on this topic (the largest lag; "" when no group lags): the
	// vacuum keeps every message above the lowest cursor of any group. An
	// abandoned group holds retention for ever: delete it with DeleteGroup.
	RetentionHeldBy string        `json:"retention_held_by,omitempty"`
	Groups          []GroupStatus `json:"groups"`
}

// MemberStatus is a live member of a consumer group on a topic.
type MemberStatus struct {
	MemberID    string    `json:"member_id"`
	JoinedAt    time.Time `json:"joined_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// CanReject says whether the member can take a message out of the
	// stream (it has a RejectHandler).
	CanReject bool `json:"can_reject"`
}

// GroupStatus is one consumer group on one topic: totals over its
// partitions, and each partition.
type GroupStatus struct {
	Group string `json:"group"`
	// Lag is the number of messages sequenced but not yet done by the
	// group, over all partitions.
	Lag int64 `json:"lag"`
	// MaxLagSeconds is the largest LagSeconds of its partitions.
	MaxLagSeconds float64 `json:"max_lag_seconds"`
	// Counts of partitions paused, leased (by a live member) and with
	// failures recorded on their next message.
	Paused  int `json:"paused"`
	Leased  int `json:"leased"`
	Failing int `json:"failing"`
	// DeadLetters is the number of pending dead-letter entries.
	DeadLetters int64 `json:"dead_letters"`
	// BackingOff counts partitions waiting out a backoff after a failure.
	BackingOff int `json:"backing_off"`
	// Members are the group's live members on the topic (a heartbeat
	// within Config.MemberTimeout); none means nobody consumes it now.
	Members []MemberStatus `json:"members"`
	// RetriesForever is set when a live member has no RejectHandler: a
	// message that keeps failing in its partitions is retried for ever and
	// stalls them (unless the handler uses outbox.RejectTo).
	RetriesForever bool `json:"retries_forever"`
	// LastActivity is the latest of the group's cursor changes (moves,
	// failures, pauses) and member heartbeats on the topic.
	LastActivity *time.Time `json:"last_activity,omitempty"`
	// HoldsRetention is set when the group's cursor is the lowest of all
	// groups in a partition that still has messages after it.
	HoldsRetention bool              `json:"holds_retention"`
	Partitions     []PartitionStatus `json:"partitions"`
}

// PartitionStatus is one consumer group's cursor in one partition.
type PartitionStatus struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	// HeadSeq is the partition's last sequenced seq; Cursor the seq of the
	// last message the group finished; Lag the difference (messages to
	// go).
	HeadSeq int64 `json:"head_seq"`
	Cursor  int64 `json:"cursor"`
	Lag     int64 `json:"lag"`
	// OldestUnprocessedAt is when the group's next message was sequenced,
	// and LagSeconds how long ago that was (0 when nothing is waiting).
	OldestUnprocessedAt *time.Time `json:"oldest_unprocessed_at,omitempty"`
	LagSeconds          float64    `json:"lag_seconds"`
	// FirstRetainedSeq is the oldest seq the log still holds for the
	// partition (0: none); a reset further back replays from there.
	FirstRetainedSeq int64 `json:"first_retained_seq"`
	// The lease: its owner (member id) and expiry as stored, whether it is
	// live now, and its fencing token.
	LeaseOwner     string     `json:"lease_owner,omitempty"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	Leased         bool       `json:"leased"`
	LeaseToken     int64      `json:"lease_token"`
	Paused         bool       `json:"paused"`
	// AdaptiveState and BatchSize are the worker's batching state as last
	// recorded ("normal" or "degraded"; batch size 0: not recorded yet).
	AdaptiveState string `json:"adaptive_state"`
	BatchSize     int    `json:"batch_size"`
	// Attempts counts failed attempts at the next message since the cursor
	// last moved (deliveries that ended without an outcome, a crash,
	// included once a new holder found them), LastError is the latest.
	Attempts int `json:"attempts"`
	// Deliveries counts deliveries of the next message that were started
	// (counted before hand-out); more than Attempts while no lease is live
	// means deliveries ended without an outcome.
	Deliveries int `json:"deliveries"`
	// BackoffUntil is when the retry of the next message is due after its
	// last failure; BackingOff says whether that is still ahead.
	BackoffUntil *time.Time `json:"backoff_until,omitempty"`
	BackingOff   bool       `json:"backing_off"`
	LastError    string     `json:"last_error,omitempty"`
	LastErrorAt  *time.Time `json:"last_error_at,omitempty"`
	// UpdatedAt is when the cursor row last changed (cursor moved, failure
	// recorded, pause, reset).
	UpdatedAt time.Time `json:"updated_at"`
	// DeadLetters is the number of pending dead-letter entries of the group
	// from this partition.
	DeadLetters int64 `json:"dead_letters"`
}

// LagAge is how long the group's next message has been waiting.
func (p PartitionStatus) LagAge() time.Duration {
	return time.Duration(p.LagSeconds * float64(time.Second))
}

// Status reports the topics, groups and partitions f selects, from one
// consistent snapshot. With f.Group set, only topics that group consumes
// are reported.
func (a *Admin) Status(ctx context.Context, f Filter) (Report, error) {
	if err := a.check(ctx); err != nil {
		return Report{}, err
	}
	var rep Report
	err := pgx.BeginTxFunc(ctx, a.cfg.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&rep.At); err != nil {
			return err
		}
		topics, err := a.topics(ctx, tx, f)
		if err != nil {
			return err
		}
		parts, err := a.partitions(ctx, tx, f, rep.At)
		if err != nil {
			return err
		}
		members, err := a.members(ctx, tx, f)
		if err != nil {
			return err
		}
		rep.Topics = assemble(topics, parts, f.Group != "")
		addMembers(rep.Topics, members)
		return nil
	})
	if err != nil {
		return Report{}, schemaErr(fmt.Errorf("admin: status: %w", err), a.cfg.Schema)
	}
	return rep, nil
}

type memberRow struct {
	group, topic string
	MemberStatus
}

// members reads the live members of the selected groups and topics.
func (a *Admin) members(ctx context.Context, tx pgx.Tx, f Filter) ([]memberRow, error) {
	rows, err := tx.Query(ctx, `SELECT group_name, topic, member_id, joined_at, heartbeat_at, can_reject
	FROM `+a.s+`.members
	WHERE ($1 = '' OR group_name = $1) AND ($2 = '' OR topic = $2)
		AND heartbeat_at > now() - $3::int8 * interval '1 microsecond'
	ORDER BY group_name, topic, member_id`, f.Group, f.Topic, a.cfg.MemberTimeout.Microseconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []memberRow
	for rows.Next() {
		var m memberRow
		if err := rows.Scan(&m.group, &m.topic, &m.MemberID, &m.JoinedAt, &m.HeartbeatAt, &m.CanReject); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// addMembers puts the live members under their groups, and works out each
// group's last activity, whether it retries poison for ever, and which
// group holds retention back.
func addMembers(topics []TopicStatus, members []memberRow) {
	for ti := range topics {
		t := &topics[ti]
		for gi := range t.Groups {
			g := &t.Groups[gi]
			g.Members = []MemberStatus{}
			for _, m := range members {
				if m.group != g.Group || m.topic != t.Topic {
					continue
				}
				g.Members = append(g.Members, m.MemberStatus)
				g.RetriesForever = g.RetriesForever || !m.CanReject
				if g.LastActivity == nil || m.HeartbeatAt.After(*g.LastActivity) {
					at := m.HeartbeatAt
					g.LastActivity = &at
				}
			}
		}
		// Per partition, the group(s) with the lowest cursor hold retention
		// back there (if any message is left after it).
		low := map[int]int64{}
		for _, g := range t.Groups {
			for _, p := range g.Partitions {
				if c, ok := low[p.Partition]; !ok || p.Cursor < c {
					low[p.Partition] = p.Cursor
				}
			}
		}
		var most int64
		for gi := range t.Groups {
			g := &t.Groups[gi]
			for _, p := range g.Partitions {
				if p.Lag > 0 && p.Cursor == low[p.Partition] {
					g.HoldsRetention = true
				}
			}
			if g.HoldsRetention && g.Lag > most {
				most, t.RetentionHeldBy = g.Lag, g.Group
			}
		}
	}
}

func (a *Admin) topics(ctx context.Context, tx pgx.Tx, f Filter) ([]TopicStatus, error) {
	rows, err := tx.Query(ctx, `SELECT t.name, t.partitions,
		coalesce((SELECT sum(p.last_seq) FROM `+a.s+`.partitions p WHERE p.topic = t.name), 0)::int8,
		(SELECT count(*) FROM `+a.s+`.pending m WHERE m.topic = t.name)
	FROM `+a.s+`.topics t WHERE $1 = '' OR t.name = $1 ORDER BY t.name`, f.Topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TopicStatus
	for rows.Next() {
		var t TopicStatus
		if err := rows.Scan(&t.Topic, &t.Partitions, &t.Sequenced, &t.Unsequenced); err != nil {
			return nil, err
		}
		t.Groups = []GroupStatus{}
		out = append(out, t)
	}
	return out, rows.Err()
}

func (a *Admin) partitions(ctx context.Context, tx pgx.Tx, f Filter, now time.Time) ([]PartitionStatus, error) {
	rows, err := tx.Query(ctx, `SELECT c.group_name, c.topic, c.partition, coalesce(p.last_seq, 0), c.seq,
		u.sequenced_at,
		coalesce((SELECT l.seq FROM `+a.s+`.log l WHERE l.topic = c.topic AND l.partition = c.partition ORDER BY l.seq LIMIT 1), 0),
		coalesce(c.lease_owner, ''), c.lease_expires_at, c.lease_owner IS NOT NULL AND coalesce(c.lease_expires_at > now(), false),
		c.lease_token, c.paused, c.adaptive_state, coalesce(c.batch_size, 0), c.attempts, coalesce(c.last_error, ''),
		c.last_error_at, c.updated_at, c.deliveries, c.backoff_until,
		(SELECT count(*) FROM `+a.s+`.dead_letters d WHERE d.group_name = c.group_name AND d.topic = c.topic
			AND d.partition = c.partition AND d.status = 'pending')
	FROM `+a.s+`.cursors c
	LEFT JOIN `+a.s+`.partitions p ON p.topic = c.topic AND p.partition = c.partition
	LEFT JOIN LATERAL (
		SELECT l.sequenced_at FROM `+a.s+`.log l
		WHERE l.topic = c.topic AND l.partition = c.partition AND l.seq > c.seq ORDER BY l.seq LIMIT 1
	) u ON true
	WHERE ($1 = '' OR c.group_name = $1) AND ($2 = '' OR c.topic = $2)
	ORDER BY c.topic, c.group_name, c.partition`, f.Group, f.Topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []PartitionStatus
	for rows.Next() {
		var p PartitionStatus
		if err := rows.Scan(&p.Group, &p.Topic, &p.Partition, &p.HeadSeq, &p.Cursor, &p.OldestUnprocessedAt,
			&p.FirstRetainedSeq, &p.LeaseOwner, &p.LeaseExpiresAt, &p.Leased, &p.LeaseToken, &p.Paused,
			&p.AdaptiveState, &p.BatchSize, &p.Attempts, &p.LastError, &p.LastErrorAt, &p.UpdatedAt, &p.Deliveries,
			&p.BackoffUntil, &p.DeadLetters); err != nil {
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
		out = append(out, p)
	}
	return out, rows.Err()
}

// assemble groups the partition rows (ordered by topic, group, partition)
// under their topics.
func assemble(topics []TopicStatus, parts []PartitionStatus, onlyConsumed bool) []TopicStatus {
	byTopic := map[string]*TopicStatus{}
	for i := range topics {
		byTopic[topics[i].Topic] = &topics[i]
	}
	for _, p := range parts {
		t := byTopic[p.Topic]
		if t == nil {
			continue // cursors of a topic that is not registered
		}
		if n := len(t.Groups); n == 0 || t.Groups[n-1].Group != p.Group {
			t.Groups = append(t.Groups, GroupStatus{Group: p.Group})
		}
		g := &t.Groups[len(t.Groups)-1]
		g.Partitions = append(g.Partitions, p)
		if g.LastActivity == nil || p.UpdatedAt.After(*g.LastActivity) {
			at := p.UpdatedAt
			g.LastActivity = &at
		}
		if p.BackingOff {
			g.BackingOff++
		}
		g.Lag += p.Lag
		g.MaxLagSeconds = max(g.MaxLagSeconds, p.LagSeconds)
		g.DeadLetters += p.DeadLetters
		if p.Paused {
			g.Paused++
		}
		if p.Leased {
			g.Leased++
		}
		if p.Attempts > 0 {
			g.Failing++
		}
	}
	out := make([]TopicStatus, 0, len(topics))
	for _, t := range topics {
		if onlyConsumed && len(t.Groups) == 0 {
			continue
		}
		out = append(out, t)
	}
	return out
}
