package admin

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
	// WALSlot is the log-based mode's replication slot (relay package),
	// nil when the schema has none.
	WALSlot *WALSlot `json:"wal_slot,omitempty"`
}

// WALSlot is the state of the schema's replication slot: while no relay
// streams it (Active false), PostgreSQL keeps the WAL from its position on
// (RetainedWALBytes), and messages published in outbox.ModeWAL wait there.
type WALSlot struct {
	Slot   string `json:"slot"`
	Active bool   `json:"active"`
	// ActiveInstance says who streams the slot: the relay.Config.Instance
	// of the relay (host:pid by default), or the whole application_name of
	// a session that is not a relay's; ActivePID is its server process.
	ActiveInstance   string `json:"active_instance,omitempty"`
	ActivePID        int32  `json:"active_pid,omitempty"`
	RetainedWALBytes int64  `json:"retained_wal_bytes"`
	// WALStatus is PostgreSQL's: reserved, extended, unreserved, or lost
	// (invalidated by max_slot_wal_keep_size).
	WALStatus string `json:"wal_status"`
}

// TopicStatus is the status of one topic and the groups consuming it.
type TopicStatus struct {
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
	// Sequenced is how many messages were ever sequenced (the sum of the
	// partitions' head seqs); Unsequenced how many committed messages wait
	// for the sequencer.
	//
	// For a forwarder-only topic (ForwardOnly; outbox.ForwardOnly) there
	// is no sequencer and no log: Sequenced counts the messages forwarded
	// (or dead-lettered) and Unsequenced those waiting for the forwarder,
	// its whole backlog, which its group's Lag counts (its cursors stand
	// at the heads, which move with them), as the metrics
	// outbox_pending_messages and outbox_pending_oldest_age_seconds do.
	Sequenced   int64 `json:"sequenced"`
	Unsequenced int64 `json:"unsequenced"`
	// ForwardOnly: the topic was registered with outbox.ForwardOnly. Its
	// messages go from pending to the broker in one step.
	ForwardOnly bool `json:"forward_only"`
	// Delayed counts the Unsequenced messages published with a delivery
	// time (outbox.DeliverAt) that has not come; NextDueAt is the earliest
	// such time (nil when none). They, and the later messages of their
	// keys that wait behind them, are not counted in the groups' Lag.
	Delayed   int64      `json:"delayed"`
	NextDueAt *time.Time `json:"next_due_at,omitempty"`
	// BehindDelayed counts the Unsequenced messages that are not delayed
	// (or are due) but wait behind a delayed message of their key that is
	// not due yet: order per key holds them until it is (outbox.Unordered
	// opts a message out). A long delay on one message of a key delays
	// every later message of that key: this is how many it delays now.
	BehindDelayed int64 `json:"behind_delayed"`
	// RetentionHeldBy is the group that holds the retention vacuum back
	// most on this topic ("" when none does): of the groups whose cursor is
	// the lowest in a partition with messages left after it, the one with
	// the most messages between those cursors and the heads. The vacuum
	// keeps every message above the lowest cursor of any group, so an
	// abandoned group holds retention for ever: delete it with DeleteGroup.
	// It is worked out over every group, whatever Filter.Group.
	RetentionHeldBy string `json:"retention_held_by,omitempty"`
	// DedupKeys counts the topic's dedup keys (outbox.DedupKey) whose
	// window is not over, up to DedupKeysCountLimit (at the limit: that
	// many or more).
	DedupKeys int64         `json:"dedup_keys"`
	Groups    []GroupStatus `json:"groups"`
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
//
// A group listed with Members but no Partitions has live members and no
// cursors on the topic: its cursors were deleted (DeleteGroup with Force)
// while its subscribers ran; they consume nothing until restarted.
type GroupStatus struct {
	Group string `json:"group"`
	// Lag is the number of messages committed but not yet done by the
	// group: the Lag of its partitions, plus the topic's Unsequenced
	// messages, which every group of the topic has yet to handle (they
	// pile up there while no sequencer runs).
	Lag int64 `json:"lag"`
	// MaxLagSeconds is the largest LagSeconds of its partitions, or the
	// age of the topic's oldest Unsequenced message if that is older.
	MaxLagSeconds float64 `json:"max_lag_seconds"`
	// Counts of partitions paused, leased (by a live member) and with
	// failures recorded on their next message.
	Paused  int `json:"paused"`
	Leased  int `json:"leased"`
	Failing int `json:"failing"`
	// BackingOff counts partitions waiting out a backoff after a failure
	// (PartitionStatus.BackingOff).
	BackingOff int `json:"backing_off"`
	// Unanswered counts partitions whose next message has deliveries that
	// ended without an outcome (PartitionStatus.Unanswered): a consumer
	// died, was killed or froze while handling it.
	Unanswered int `json:"unanswered"`
	// DeadLetters is the number of pending dead-letter entries.
	DeadLetters int64 `json:"dead_letters"`
	// Members are the group's live members on the topic (a heartbeat
	// within the member's lease TTL), by id; none means nobody consumes
	// for the group now.
	Members []MemberStatus `json:"members"`
	// CannotReject counts the Members without a RejectHandler, and
	// RetriesForever is set when there is one: a message that keeps failing
	// in the partitions they hold is retried for ever and stalls its
	// partition (unless the handler rejects with outbox.RejectTo). With
	// CannotReject < len(Members) only some partitions are exposed
	// (PartitionStatus.RetriesForever).
	CannotReject   int  `json:"cannot_reject"`
	RetriesForever bool `json:"retries_forever"`
	// LastActivity is the latest sign of life of the group on the topic:
	// a change of one of its cursor rows (a cursor move, a recorded
	// failure, a pause or reset: PartitionStatus.UpdatedAt) or a member's
	// heartbeat, live or not (member rows stay up to 10 lease TTLs after
	// the last heartbeat). Nil when there is neither.
	LastActivity *time.Time `json:"last_activity,omitempty"`
	// HeldKeys and HeldMessages total the partitions' held keys and
	// messages (key-level isolation); IsolationFull counts the partitions
	// blocking because their bounds on them are reached.
	HeldKeys      int `json:"held_keys"`
	HeldMessages  int `json:"held_messages"`
	IsolationFull int `json:"isolation_full"`
	// HoldsRetention is set when the group's cursor is the lowest of all
	// groups in a partition that still has messages after it
	// (PartitionStatus.HoldsRetention): the vacuum cannot delete them until
	// it moves. With no Members, it is likely abandoned: DeleteGroup.
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
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// Deliveries counts deliveries of the next message that were started
	// (counted before hand-out, so a delivery that crashes its consumer
	// is counted too).
	Deliveries int `json:"deliveries"`
	// Unanswered is 1 while no lease is live and the last holder left a
	// delivery in flight: it ended without an outcome (the consumer died,
	// was killed or froze past its lease). The next lease holder settles
	// it: a failed attempt if it was the only delivery in flight in its
	// process, else its messages become Suspects. 0 while a lease is live
	// (a delivery may be in flight).
	Unanswered int `json:"unanswered"`
	// Suspects counts the messages after the cursor that were in flight
	// when a consumer process died with other deliveries in flight: nobody
	// was charged, and each is delivered alone in its process until it
	// has an outcome (docs/failure-modes.md §3).
	Suspects int64 `json:"suspects"`
	// BackoffUntil is when the retry of the next message is due after its
	// last failure (it survives restarts and lease moves); BackingOff says
	// whether that is still ahead, at Report.At.
	BackoffUntil *time.Time `json:"backoff_until,omitempty"`
	BackingOff   bool       `json:"backing_off"`
	// RetriesForever is set when the lease is live and its owner is a live
	// member without a RejectHandler: a message that keeps failing here is
	// retried for ever.
	RetriesForever bool `json:"retries_forever"`
	// HoldsRetention is set when the group's cursor is the lowest of all
	// groups here and messages are left after it: the vacuum keeps them
	// until it moves.
	HoldsRetention bool `json:"holds_retention"`
	// UpdatedAt is when the cursor row last changed (cursor moved, failure
	// recorded, pause, reset).
	UpdatedAt time.Time `json:"updated_at"`
	// DeadLetters is the number of pending dead-letter entries of the group
	// from this partition.
	DeadLetters int64 `json:"dead_letters"`

	// Key-level isolation (outbox.KeyIsolation). ScanSeq is how far the
	// worker has scanned: everything at or below it was delivered or is
	// held; Cursor is below the lowest held seq. HeldKeys are the keys
	// held back, oldest head first (a keyless message is one of its own),
	// HeldMessages how many messages they hold. IsolationFullSince, when
	// set, is since when the partition blocks as it would without
	// isolation, because holding one more key or message would pass
	// KeyIsolation.MaxHeldKeys, or outbox.HeldMessagesPerKey messages per
	// allowed key.
	ScanSeq            int64      `json:"scan_seq"`
	HeldKeys           []HeldKey  `json:"held_keys,omitempty"`
	HeldMessages       int        `json:"held_messages"`
	IsolationFullSince *time.Time `json:"isolation_full_since,omitempty"`
}

// HeldKey is a partition key whose messages a consumer group holds back
// (key-level isolation) while the rest of the partition flows: its first
// message failed and is retried; the others wait behind it in seq order.
type HeldKey struct {
	// Key is the partition key; Keyless marks a message without one, held
	// alone (HeadSeq names it).
	Key     string `json:"key"`
	Keyless bool   `json:"keyless,omitempty"`
	// HeadSeq is the seq of the message retried; Messages how many the key
	// holds (the head included).
	HeadSeq  int64 `json:"head_seq"`
	Messages int   `json:"messages"`
	// Attempts counts the head's deliveries (a retry in flight included);
	// LastError is its latest failure.
	Attempts     int        `json:"attempts"`
	LastError    string     `json:"last_error,omitempty"`
	FirstFailure *time.Time `json:"first_failure,omitempty"`
	// RetryAt is when the head's next retry is due (nil: at once).
	RetryAt *time.Time `json:"retry_at,omitempty"`
	HeldAt  time.Time  `json:"held_at"`
	// Requested is an operator's request waiting for the lease holder
	// ("dead_letter"), or "".
	Requested string `json:"requested,omitempty"`
}

// LagAge is how long the group's next message has been waiting.
func (p PartitionStatus) LagAge() time.Duration {
	return time.Duration(p.LagSeconds * float64(time.Second))
}

// Status reports the topics, groups and partitions f selects, from one
// consistent snapshot. With f.Group set, only topics that group consumes
// are reported. A filter naming a topic that is not registered, or a group
// without cursors or members (on f.Topic, when set), is a *NotFoundError
// (outbox.ErrNotFound), never an empty report.
func (a *Admin) Status(ctx context.Context, f Filter) (Report, error) {
	if err := a.check(ctx); err != nil {
		return Report{}, err
	}
	var (
		rep     Report
		missing *NotFoundError
	)
	err := pgx.BeginTxFunc(ctx, a.cfg.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, a.q.CatalogNow).Scan(&rep.At); err != nil {
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
		if err := a.held(ctx, tx, f, parts); err != nil {
			return err
		}
		members, err := a.members(ctx, tx, f)
		if err != nil {
			return err
		}
		holders, err := a.holders(ctx, tx, f)
		if err != nil {
			return err
		}
		rep.Topics = assemble(topics, parts, members, f.Group != "")
		if len(rep.Topics) == 0 && (f.Group != "" || f.Topic != "") {
			if missing, err = a.missing(ctx, tx, f.Group, f.Topic, nil); err != nil || missing != nil {
				return err
			}
		}
		addHolders(rep.Topics, holders)
		if err := a.addUnsequenced(ctx, tx, rep.Topics); err != nil {
			return err
		}
		if err := a.addDedupKeys(ctx, tx, f, rep.Topics); err != nil {
			return err
		}
		rep.WALSlot, err = a.walSlot(ctx, tx)
		return err
	})
	if err != nil {
		return Report{}, schemaErr(fmt.Errorf("admin: status: %w", err), a.cfg.Schema)
	}
	if missing != nil {
		return Report{}, missing
	}
	return rep, nil
}

// assemble groups the partition rows (ordered by topic, group, partition)
// and the member rows under their topics, and works out the group totals.
func assemble(topics []TopicStatus, parts []PartitionStatus, members []memberRow, onlyConsumed bool) []TopicStatus {
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
			t.Groups = append(t.Groups, GroupStatus{Group: p.Group, Members: []MemberStatus{}})
		}
		g := &t.Groups[len(t.Groups)-1]
		g.Partitions = append(g.Partitions, p)
		g.LastActivity = latest(g.LastActivity, p.UpdatedAt)
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
		if p.BackingOff {
			g.BackingOff++
		}
		if p.Unanswered > 0 {
			g.Unanswered++
		}
		g.HeldKeys += len(p.HeldKeys)
		g.HeldMessages += p.HeldMessages
		if p.IsolationFullSince != nil {
			g.IsolationFull++
		}
	}
	// Members: live ones are listed; every heartbeat counts as activity.
	for _, m := range members {
		t := byTopic[m.topic]
		if t == nil {
			continue
		}
		i := slices.IndexFunc(t.Groups, func(g GroupStatus) bool { return g.Group == m.group })
		if i < 0 {
			if !m.live {
				continue // a dead member of a group without cursors here
			}
			t.Groups = append(t.Groups, GroupStatus{Group: m.group, Members: []MemberStatus{}, Partitions: []PartitionStatus{}})
			i = len(t.Groups) - 1
		}
		g := &t.Groups[i]
		g.LastActivity = latest(g.LastActivity, m.HeartbeatAt)
		if !m.live {
			continue
		}
		g.Members = append(g.Members, m.MemberStatus)
		if !m.CanReject {
			g.CannotReject++
			g.RetriesForever = true
			for pi := range g.Partitions {
				if p := &g.Partitions[pi]; p.Leased && p.LeaseOwner == m.MemberID {
					p.RetriesForever = true
				}
			}
		}
	}
	out := make([]TopicStatus, 0, len(topics))
	for _, t := range topics {
		if onlyConsumed && len(t.Groups) == 0 {
			continue
		}
		slices.SortStableFunc(t.Groups, func(a, b GroupStatus) int { return strings.Compare(a.Group, b.Group) })
		out = append(out, t)
	}
	return out
}

// latest returns the later of at and t.
func latest(at *time.Time, t time.Time) *time.Time {
	if at == nil || t.After(*at) {
		return &t
	}
	return at
}
