package deadletter

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// Page sizes of List.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Metadata Replay sets on the message it publishes.
const (
	// MetadataReplayOf is the id of the dead-letter entry replayed.
	MetadataReplayOf = "deadletter_replay_of"
	// MetadataOriginalUUID is the UUID of the message that was
	// dead-lettered (the replayed message has a new one).
	MetadataOriginalUUID = "deadletter_original_uuid"
)

// Filter selects entries. Zero fields select everything.
type Filter struct {
	// Group and Topic select one consumer group and one topic.
	Group string `json:"group,omitempty"`
	Topic string `json:"topic,omitempty"`
	// Statuses selects entries in any of these states.
	Statuses []Status `json:"statuses,omitempty"`
	// From and To bound CreatedAt: From <= CreatedAt < To.
	From time.Time `json:"from,omitzero"`
	To   time.Time `json:"to,omitzero"`
}

// ListOptions are the arguments of List.
type ListOptions struct {
	Filter
	// Limit is the page size (default DefaultPageSize, at most
	// MaxPageSize).
	Limit int
	// Cursor continues after the previous page (its NextCursor); empty for
	// the first page.
	Cursor string
	// Descending lists the newest entries first (default: oldest first).
	Descending bool
}

// Page is one page of List.
type Page struct {
	Entries []Entry `json:"entries"`
	// NextCursor continues the listing; empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// scanEntry reads the entry columns every dead-letter statement returns, in
// the order of dead_letters.sql.
func scanEntry(row pgx.Row) (Entry, error) {
	var (
		e         Entry
		partition *int32
		seq       *int64
		status    string
	)
	err := row.Scan(&e.ID, &e.Group, &e.Topic, &partition, &seq, &e.UUID, &e.PartitionKey, &e.Metadata, &e.Payload,
		&e.Reason, &e.Attempts, &e.FirstFailureAt, &e.LastFailureAt, &status, &e.ReplayTopic, &e.ReplayUUID,
		&e.CreatedAt, &e.UpdatedAt)
	if err != nil {
		return Entry{}, err
	}
	e.Status = Status(status)
	if partition != nil && seq != nil {
		e.Partition, e.Seq = int(*partition), *seq
	} else {
		e.Partition, e.External = -1, true
	}
	if e.Metadata == nil {
		e.Metadata = map[string]string{}
	}
	return e, nil
}

// args returns f as the filter parameters of the dead-letter statements
// ($1 group, $2 topic, $3 statuses, $4 from, $5 to; see dead_letters.sql).
func (f Filter) args() ([]any, error) {
	statuses := make([]string, len(f.Statuses))
	for i, st := range f.Statuses {
		if !st.valid() {
			return nil, invalidArg("unknown status %q", st)
		}
		statuses[i] = string(st)
	}
	return []any{f.Group, f.Topic, statuses, timeOrNil(f.From), timeOrNil(f.To)}, nil
}

// List returns a page of the entries f selects, ordered by id (the order
// they were written in). Paging is by keyset: a cursor stays valid while
// entries are added or removed, and no entry appears on two pages.
func (s *Store) List(ctx context.Context, opts ListOptions) (Page, error) {
	if err := s.check(ctx); err != nil {
		return Page{}, err
	}
	limit := opts.Limit
	switch {
	case limit == 0:
		limit = DefaultPageSize
	case limit < 0 || limit > MaxPageSize:
		return Page{}, invalidArg("limit %d is outside 1..%d", limit, MaxPageSize)
	}
	args, err := opts.Filter.args()
	if err != nil {
		return Page{}, err
	}
	dir, stmt := "a", s.q.DeadLettersListAscending
	if opts.Descending {
		dir, stmt = "d", s.q.DeadLettersListDescending
	}
	var after *int64 // NULL: from the start
	if opts.Cursor != "" {
		id, err := decodeCursor(opts.Cursor, dir)
		if err != nil {
			return Page{}, err
		}
		after = &id
	}
	rows, err := s.cfg.Pool.Query(ctx, stmt, append(args, after, limit+1)...)
	if err != nil {
		return Page{}, s.wrap(fmt.Errorf("deadletter: list: %w", err))
	}
	defer rows.Close()
	page := Page{Entries: make([]Entry, 0, limit)}
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return Page{}, fmt.Errorf("deadletter: list: %w", err)
		}
		page.Entries = append(page.Entries, e)
	}
	if err := rows.Err(); err != nil {
		return Page{}, s.wrap(fmt.Errorf("deadletter: list: %w", err))
	}
	if len(page.Entries) > limit {
		page.Entries = page.Entries[:limit]
		page.NextCursor = encodeCursor(dir, page.Entries[limit-1].ID)
	}
	return page, nil
}

func encodeCursor(dir string, id int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(dir + ":" + strconv.FormatInt(id, 10)))
}

func decodeCursor(c, dir string) (int64, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, ErrInvalidCursor
	}
	d, n, ok := strings.Cut(string(b), ":")
	if !ok || d != dir {
		return 0, ErrInvalidCursor
	}
	id, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		return 0, ErrInvalidCursor
	}
	return id, nil
}

// Count returns how many entries f selects.
func (s *Store) Count(ctx context.Context, f Filter) (int64, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	args, err := f.args()
	if err != nil {
		return 0, err
	}
	var n int64
	if err := s.cfg.Pool.QueryRow(ctx, s.q.DeadLettersCount, args...).Scan(&n); err != nil {
		return 0, s.wrap(fmt.Errorf("deadletter: count: %w", err))
	}
	return n, nil
}

// Get returns the entry with the given id, or an error matching
// outbox.ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (Entry, error) {
	if err := s.check(ctx); err != nil {
		return Entry{}, err
	}
	return s.get(ctx, s.cfg.Pool, id, false)
}

func (s *Store) get(ctx context.Context, q querier, id int64, lock bool) (Entry, error) {
	stmt := s.q.DeadLettersGet
	if lock {
		stmt = s.q.DeadLettersGetForUpdate
	}
	e, err := scanEntry(q.QueryRow(ctx, stmt, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, fmt.Errorf("%w: id %d", sentinel.ErrNotFound, id)
	}
	if err != nil {
		return Entry{}, s.wrap(fmt.Errorf("deadletter: get %d: %w", id, err))
	}
	return e, nil
}

// ReplayOptions are the arguments of Replay.
type ReplayOptions struct {
	// Topic is where the message is published again (default: the
	// entry's own topic). It must be registered.
	Topic string
}

// deliveryMetadata are the keys the Subscriber and the PoisonQueue
// middleware add on delivery; a replayed message starts without them.
var deliveryMetadata = []string{
	outbox.MetadataTopic, outbox.MetadataPartition, outbox.MetadataSeq, outbox.MetadataAttempt, outbox.MetadataID, outbox.MetadataIncarnation,
	middleware.ReasonForPoisonedKey, middleware.PoisonedTopicKey, middleware.PoisonedHandlerKey, middleware.PoisonedSubscriberKey,
}

// Replay publishes the entry's message again, as a new message (new UUID)
// with its payload, partition key and metadata (without the delivery
// metadata the Subscriber and the PoisonQueue middleware added, and with
// MetadataReplayOf and MetadataOriginalUUID), to its topic or opts.Topic,
// and marks the entry replayed: both in one transaction, so the message is
// published if and only if the status changes. The topic must be
// registered (otherwise an error matching outbox.ErrUnknownTopic). Only a
// pending entry can be replayed (*StateError otherwise).
func (s *Store) Replay(ctx context.Context, id int64, opts ReplayOptions) (Entry, error) {
	if err := s.check(ctx); err != nil {
		return Entry{}, err
	}
	var out Entry
	err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		e, err := s.get(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if e.Status != StatusPending {
			return &StateError{ID: id, Op: "replay", Status: e.Status}
		}
		topic := opts.Topic
		if topic == "" {
			topic = e.Topic
		}
		key := e.PartitionKey
		pub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{
			Schema:           s.cfg.Schema,
			PartitionKeyFunc: func(string, *message.Message) (string, error) { return key, nil },
			Partitioner:      s.cfg.Partitioner,
			// What was stored is replayed, whatever its size: the
			// limits are for new messages.
			MaxPayloadBytes:  outbox.MaxMaxPayloadBytes,
			MaxMetadataBytes: outbox.MaxMaxPublishBytes,
			MaxPublishBytes:  outbox.MaxMaxPublishBytes,
		}, s.logger)
		if err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewUUID(), e.Payload)
		for k, v := range e.Metadata {
			msg.Metadata.Set(k, v)
		}
		for _, k := range deliveryMetadata {
			delete(msg.Metadata, k)
		}
		if key != "" {
			msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
		}
		msg.Metadata.Set(MetadataReplayOf, strconv.FormatInt(e.ID, 10))
		msg.Metadata.Set(MetadataOriginalUUID, e.UUID)
		msg.SetContext(ctx)
		if err := pub.Publish(topic, msg); err != nil {
			return fmt.Errorf("deadletter: replay %d to %q: %w", id, topic, err)
		}
		out, err = scanEntry(tx.QueryRow(ctx, s.q.DeadLettersMarkReplayed, id, topic, msg.UUID))
		if err != nil {
			return fmt.Errorf("deadletter: replay %d: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return Entry{}, s.wrap(err)
	}
	s.logger.Info("Dead letter replayed", watermill.LogFields{"id": id, "topic": out.ReplayTopic, "uuid": out.ReplayUUID})
	return out, nil
}

// Discard marks a pending entry discarded: handled by someone, not to be
// replayed. Only a pending entry can be discarded (*StateError otherwise).
func (s *Store) Discard(ctx context.Context, id int64) (Entry, error) {
	if err := s.check(ctx); err != nil {
		return Entry{}, err
	}
	e, err := scanEntry(s.cfg.Pool.QueryRow(ctx, s.q.DeadLettersDiscard, id))
	if errors.Is(err, pgx.ErrNoRows) {
		cur, gerr := s.Get(ctx, id)
		if gerr != nil {
			return Entry{}, gerr
		}
		return Entry{}, &StateError{ID: id, Op: "discard", Status: cur.Status}
	}
	if err != nil {
		return Entry{}, s.wrap(fmt.Errorf("deadletter: discard %d: %w", id, err))
	}
	return e, nil
}

// PurgeOptions are the arguments of Purge.
type PurgeOptions struct {
	// OlderThan deletes entries created more than this long ago (by the
	// database clock); 0 deletes regardless of age.
	OlderThan time.Duration
	// Before, when set, deletes entries created before this time instead
	// (OlderThan must then be 0): PurgePlan.Before, so that Purge deletes
	// what PlanPurge counted.
	Before time.Time
	// Statuses are the states deleted. None means the resolved ones,
	// StatusReplayed and StatusDiscarded. A pending entry is a message
	// nobody has handled yet, which Replay can still publish again: it is
	// deleted only when StatusPending is named here.
	Statuses []Status
	// Group and Topic, when set, delete only the entries of that consumer
	// group and that topic.
	Group, Topic string
	// ChunkSize bounds the rows deleted per statement (default 1000), so
	// that a large purge never holds many locks for long.
	ChunkSize int
}

// resolvedStatuses are the statuses Purge deletes unless told otherwise:
// entries replayed or discarded, whose message was dealt with.
var resolvedStatuses = []Status{StatusReplayed, StatusDiscarded}

// statuses returns the statuses opts deletes, each once.
func (opts PurgeOptions) statuses() []Status {
	if len(opts.Statuses) == 0 {
		return slices.Clone(resolvedStatuses)
	}
	var out []Status
	for _, st := range opts.Statuses {
		if !slices.Contains(out, st) {
			out = append(out, st)
		}
	}
	return out
}

// PurgePlan is what a Purge would delete, counted by PlanPurge.
type PurgePlan struct {
	// Before is the cutoff: the entries created before it are counted;
	// pass it as PurgeOptions.Before to delete what was counted.
	Before time.Time `json:"before"`
	// Statuses are the statuses the Purge deletes.
	Statuses []Status `json:"statuses"`
	// Counts are the entries created before Before, by status, for every
	// status: those Purge deletes and those it keeps (pending ones, unless
	// named).
	Counts map[Status]int64 `json:"counts"`
}

// Deleted is how many entries the Purge deletes: the Counts of Statuses.
func (p PurgePlan) Deleted() int64 {
	var n int64
	for _, st := range p.Statuses {
		n += p.Counts[st]
	}
	return n
}

// PlanPurge counts, by status, the entries created before the cutoff opts
// gives (OlderThan by the database clock, or Before), and says which of
// them Purge(opts) would delete: for a confirmation that names what is
// lost. Pass the plan's Before to Purge to delete exactly what it counted
// (but entries whose status changed meanwhile).
func (s *Store) PlanPurge(ctx context.Context, opts PurgeOptions) (PurgePlan, error) {
	if err := s.check(ctx); err != nil {
		return PurgePlan{}, err
	}
	before, err := s.purgeCutoff(ctx, opts)
	if err != nil {
		return PurgePlan{}, err
	}
	plan := PurgePlan{Before: before, Statuses: opts.statuses(), Counts: map[Status]int64{}}
	for _, st := range []Status{StatusPending, StatusReplayed, StatusDiscarded} {
		n, err := s.Count(ctx, Filter{Group: opts.Group, Topic: opts.Topic, Statuses: []Status{st}, To: before})
		if err != nil {
			return PurgePlan{}, err
		}
		plan.Counts[st] = n
	}
	return plan, nil
}

// purgeCutoff validates opts and returns the time before which entries
// are deleted.
func (s *Store) purgeCutoff(ctx context.Context, opts PurgeOptions) (time.Time, error) {
	switch {
	case opts.OlderThan < 0:
		return time.Time{}, invalidArg("OlderThan %v is negative", opts.OlderThan)
	case opts.OlderThan > 0 && !opts.Before.IsZero():
		return time.Time{}, invalidArg("give OlderThan or Before, not both")
	case opts.ChunkSize < 0:
		return time.Time{}, invalidArg("ChunkSize %d is negative", opts.ChunkSize)
	}
	if _, err := (Filter{Statuses: opts.Statuses}).args(); err != nil {
		return time.Time{}, err
	}
	if !opts.Before.IsZero() {
		return opts.Before, nil
	}
	var cutoff time.Time
	if err := s.cfg.Pool.QueryRow(ctx, s.q.CatalogNowMinus, opts.OlderThan.Microseconds()).Scan(&cutoff); err != nil {
		return time.Time{}, s.wrap(fmt.Errorf("deadletter: purge: %w", err))
	}
	return cutoff, nil
}

// Purge deletes the entries created before the cutoff (OlderThan or
// Before) in the statuses opts names, or, when it names none, the
// resolved ones (replayed and discarded): a pending entry is deleted only
// when StatusPending is named. It returns how many it deleted.
func (s *Store) Purge(ctx context.Context, opts PurgeOptions) (int64, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	cutoff, err := s.purgeCutoff(ctx, opts)
	if err != nil {
		return 0, err
	}
	chunk := opts.ChunkSize
	if chunk == 0 {
		chunk = 1000
	}
	filter, err := Filter{Statuses: opts.statuses()}.args()
	if err != nil {
		return 0, err
	}
	statuses := filter[2]
	var total int64
	for {
		tag, err := s.cfg.Pool.Exec(ctx, s.q.DeadLettersPurge, statuses, cutoff, chunk, opts.Group, opts.Topic)
		if err != nil {
			return total, s.wrap(fmt.Errorf("deadletter: purge: %w", err))
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(chunk) {
			return total, nil
		}
	}
}
