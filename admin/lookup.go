package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// NotFoundError reports a topic, consumer group, partition or held key that
// an admin call names and the schema does not have, so that a typo never
// reads as "nothing to do": Status of an unknown group, Pause of a topic
// the group does not consume. It matches outbox.ErrNotFound; a topic that
// is not registered also matches outbox.ErrUnknownTopic.
type NotFoundError struct {
	// What is what is missing: "topic", "group", "partition" or "held key".
	What string
	// Group and Topic are the names given. For What "group" with a Topic,
	// the group has no cursors and no members on that topic; without one,
	// on any topic.
	Group string
	Topic string
	// Partitions are, for What "partition", the partitions of Topic the
	// group has no cursor in.
	Partitions []int
	// Key and Seq name the held key (What "held key"): its partition key,
	// or the seq of a keyless message.
	Key string
	Seq int64
}

func (e *NotFoundError) Error() string {
	switch e.What {
	case "topic":
		return fmt.Sprintf("admin: no such topic %q: it is not registered (Status lists the topics)", e.Topic)
	case "partition":
		return fmt.Sprintf("admin: consumer group %q has no cursor in partition(s) %v of topic %q", e.Group, e.Partitions, e.Topic)
	case "held key":
		name := fmt.Sprintf("key %q", e.Key)
		if e.Key == "" {
			name = fmt.Sprintf("keyless message at seq %d", e.Seq)
		}
		part := ""
		if len(e.Partitions) == 1 {
			part = fmt.Sprintf(" partition %d", e.Partitions[0])
		}
		return fmt.Sprintf("admin: consumer group %q holds no %s in topic %q%s (Status lists the held keys)", e.Group, name, e.Topic, part)
	}
	if e.Topic != "" {
		return fmt.Sprintf("admin: no such group %q on topic %q: it has no cursors and no members there", e.Group, e.Topic)
	}
	return fmt.Sprintf("admin: no such group %q: it has no cursors and no members on any topic", e.Group)
}

// Is makes errors.Is(err, outbox.ErrNotFound) true, and errors.Is(err,
// outbox.ErrUnknownTopic) for a topic.
func (e *NotFoundError) Is(target error) bool {
	return target == sentinel.ErrNotFound || e.What == "topic" && target == sentinel.ErrUnknownTopic
}

// Exists returns nil when the schema has every name f gives: the topic is
// registered, and the consumer group has cursors or members (on the topic,
// when f names one). Otherwise it returns a *NotFoundError that says which
// is missing. The zero Filter names nothing and exists. Status, Pause,
// Resume, ResetCursor, DeleteGroup and the held-key actions report the same
// error when what they are given selects nothing; Exists is for callers
// that read other tables (e.g. the dead-letter store) and want to tell "no
// entries" from "no such group".
func (a *Admin) Exists(ctx context.Context, f Filter) error {
	if err := a.constructed(); err != nil {
		return err
	}
	if f.Group == "" && f.Topic == "" {
		return nil
	}
	if err := a.check(ctx); err != nil {
		return err
	}
	var missing *NotFoundError
	err := pgx.BeginTxFunc(ctx, a.cfg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		missing, err = a.missing(ctx, tx, f.Group, f.Topic, nil)
		return err
	})
	if err != nil {
		return schemaErr(fmt.Errorf("admin: look up %+v: %w", f, err), a.cfg.Schema)
	}
	if missing != nil {
		return missing
	}
	return nil
}

// missing returns what the schema lacks of topic, group (on topic, when
// given) and the group's cursors in partitions of topic, the first missing
// in that order; nil when it has them all.
func (a *Admin) missing(ctx context.Context, tx pgx.Tx, group, topic string, partitions []int) (*NotFoundError, error) {
	if topic != "" {
		var n int
		err := tx.QueryRow(ctx, a.q.TopicsPartitions, topic).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			return &NotFoundError{What: "topic", Group: group, Topic: topic}, nil
		}
		if err != nil {
			return nil, err
		}
	}
	if group == "" {
		return nil, nil
	}
	has, cursors, err := a.groupRows(ctx, tx, group, topic)
	if err != nil {
		return nil, err
	}
	if !has {
		nf := &NotFoundError{What: "group", Group: group, Topic: topic}
		if topic != "" {
			// Name the group alone when it is nowhere.
			anywhere, _, err := a.groupRows(ctx, tx, group, "")
			if err != nil {
				return nil, err
			}
			if !anywhere {
				nf.Topic = ""
			}
		}
		return nf, nil
	}
	var lacking []int
	for _, p := range slices.Compact(slices.Sorted(slices.Values(partitions))) {
		if !slices.Contains(cursors, p) {
			lacking = append(lacking, p)
		}
	}
	if len(lacking) > 0 {
		return &NotFoundError{What: "partition", Group: group, Topic: topic, Partitions: lacking}, nil
	}
	return nil, nil
}

// groupRows reports whether group has cursors or member rows (live or not)
// on topic ("" for any), and the partitions of its cursors there.
func (a *Admin) groupRows(ctx context.Context, tx pgx.Tx, group, topic string) (bool, []int, error) {
	f := Filter{Group: group, Topic: topic}
	parts, err := a.partitions(ctx, tx, f, time.Now())
	if err != nil {
		return false, nil, err
	}
	cursors := make([]int, 0, len(parts))
	for _, p := range parts {
		cursors = append(cursors, p.Partition)
	}
	if len(parts) > 0 {
		return true, cursors, nil
	}
	members, err := a.members(ctx, tx, f)
	if err != nil {
		return false, nil, err
	}
	return len(members) > 0, cursors, nil
}

// explain turns the outbox.ErrNotFound of an operation on s that matched fewer
// cursors than it names into the *NotFoundError that says what is missing;
// any other error, or one it cannot explain (the cursors appeared
// meanwhile), it returns as it is.
func (a *Admin) explain(ctx context.Context, s Scope, err error) error {
	var nf *NotFoundError
	if !errors.Is(err, sentinel.ErrNotFound) || errors.As(err, &nf) {
		return err
	}
	var missing *NotFoundError
	if lerr := pgx.BeginTxFunc(ctx, a.cfg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		missing, err = a.missing(ctx, tx, s.Group, s.Topic, s.Partitions)
		return err
	}); lerr != nil || missing == nil {
		return err
	}
	return missing
}
