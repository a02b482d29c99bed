package admin

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// rowQuerier is a *pgxpool.Pool or a pgx.Tx.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DeleteGroupOptions tune DeleteGroup.
type DeleteGroupOptions struct {
	// Topic limits the deletion to the group's cursors and members on one
	// topic ("" for all its topics).
	Topic string
	// Force deletes the group even while it has live members or leases.
	// Meant for members known to be gone for good (a crashed host whose
	// heartbeat is not a lease TTL old yet). A member that is in fact
	// still running loses its leases (its workers' next cursor write fails
	// and they stop) and from then on consumes nothing on the deleted
	// topics, while it keeps heartbeating (Status lists the group with
	// members and no partitions); restarting its Subscriber creates the
	// group afresh, from the oldest retained message (the newest with
	// StartFromNewest).
	Force bool
	// DeadLetters also deletes the group's dead-letter entries, whatever
	// their status (those of Topic only, when it is set). By default they
	// are kept: they are the only copy of a poison message once the
	// vacuum deleted its log row, and deadletter.Store can still list,
	// replay, discard and purge them.
	DeadLetters bool
}

// DeletedGroup says what DeleteGroup removed.
type DeletedGroup struct {
	Group string `json:"group"`
	// Topic is the topic the deletion was limited to ("": all).
	Topic string `json:"topic,omitempty"`
	// Cursors, Members and DeadLetters count the rows deleted.
	Cursors     int64 `json:"cursors"`
	Members     int64 `json:"members"`
	DeadLetters int64 `json:"dead_letters"`
}

// DeleteGroup removes a consumer group that is no longer used: its cursors
// (and with them its hold on retention: the next vacuum pass deletes what
// only this group kept) and its member rows, on one topic
// (opts.Topic) or all of them, in one transaction that locks them first,
// so nothing is ever half deleted and no lease is taken meanwhile.
//
// A group in use is refused with a *GroupActiveError
// (errors.Is(err, ErrGroupActive)) that lists its live members: a member
// whose last heartbeat is within its lease TTL, or the owner of an
// unexpired lease on one of its partitions. Stop its subscribers first,
// or pass opts.Force. A refusal does not wait for the group's running
// transactions. A group with nothing to delete in the scope (no cursors
// or members, nor dead letters with opts.DeadLetters) is a *NotFoundError
// (outbox.ErrNotFound) that says whether the topic or the group is unknown; an
// empty group or bad topic name is outbox.ErrInvalidArgument or an
// outbox.ErrInvalidName.
//
// Dead letters are kept unless opts.DeadLetters (see DeleteGroupOptions).
func (a *Admin) DeleteGroup(ctx context.Context, group string, opts DeleteGroupOptions) (deleted DeletedGroup, err error) {
	ctx, span := startSpan(ctx, "delete group", group, opts.Topic)
	defer func() { span.EndWith(err) }()
	return a.deleteGroup(ctx, group, opts)
}

func (a *Admin) deleteGroup(ctx context.Context, group string, opts DeleteGroupOptions) (DeletedGroup, error) {
	if err := (Scope{Group: group, Topic: opts.Topic}).validate(); err != nil {
		return DeletedGroup{}, err
	}
	if err := a.check(ctx); err != nil {
		return DeletedGroup{}, err
	}
	if !opts.Force {
		// Refuse a live group at once, before waiting for row locks its
		// workers' transactions may hold for a whole batch.
		if err := a.refuseActive(ctx, a.cfg.Pool, group, opts.Topic); err != nil {
			return DeletedGroup{}, schemaErr(err, a.cfg.Schema)
		}
	}
	out := DeletedGroup{Group: group, Topic: opts.Topic}
	err := pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		// Lock the group's cursors and member rows, in key order (as the
		// other admin operations do): until the decision commits, no lease
		// on them can be acquired, renewed or written (the lease manager
		// skips locked rows) and no existing member's heartbeat recorded.
		if _, err := tx.Exec(ctx, a.q.CursorsLockGroup, group, opts.Topic); err != nil {
			return fmt.Errorf("admin: delete group: lock cursors: %w", err)
		}
		if _, err := tx.Exec(ctx, a.q.MembersLockGroup, group, opts.Topic); err != nil {
			return fmt.Errorf("admin: delete group: lock members: %w", err)
		}
		if !opts.Force {
			if err := a.refuseActive(ctx, tx, group, opts.Topic); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(ctx, a.q.CursorsDeleteGroup, group, opts.Topic)
		if err != nil {
			return fmt.Errorf("admin: delete group: cursors: %w", err)
		}
		out.Cursors = tag.RowsAffected()
		if tag, err = tx.Exec(ctx, a.q.MembersDeleteGroup, group, opts.Topic); err != nil {
			return fmt.Errorf("admin: delete group: members: %w", err)
		}
		out.Members = tag.RowsAffected()
		if opts.DeadLetters {
			if tag, err = tx.Exec(ctx, a.q.DeadLettersDeleteGroup, group, opts.Topic); err != nil {
				return fmt.Errorf("admin: delete group: dead letters: %w", err)
			}
			out.DeadLetters = tag.RowsAffected()
		}
		if out.Cursors == 0 && out.Members == 0 && out.DeadLetters == 0 {
			what := "cursors or members"
			if opts.DeadLetters {
				what = "cursors, members or dead letters"
			}
			return fmt.Errorf("%w: consumer group %q has no %s%s (check the name with Status)", sentinel.ErrNotFound, group, what, topicSuffix(opts.Topic))
		}
		return nil
	})
	if err != nil {
		return DeletedGroup{}, a.explain(ctx, Scope{Group: group, Topic: opts.Topic}, schemaErr(err, a.cfg.Schema))
	}
	a.logger.Info("Consumer group deleted", watermill.LogFields{"group": group, "topic": opts.Topic, "force": opts.Force,
		"cursors": out.Cursors, "members": out.Members, "dead_letters": out.DeadLetters})
	return out, nil
}

func topicSuffix(topic string) string {
	if topic == "" {
		return ""
	}
	return " on topic " + topic
}

// refuseActive returns a *GroupActiveError when the group has a live
// member or an unexpired lease in the scope. Liveness is judged by the
// server's clock at the time of the statement (clock_timestamp, not the
// transaction's start).
func (a *Admin) refuseActive(ctx context.Context, q rowQuerier, group, topic string) error {
	var (
		members []string
		leased  int
	)
	err := q.QueryRow(ctx, a.q.CursorsGroupInUse, group, topic).Scan(&members, &leased)
	if err != nil {
		return fmt.Errorf("admin: delete group: live members: %w", err)
	}
	if len(members) > 0 || leased > 0 {
		return &GroupActiveError{Group: group, Topic: topic, Members: members, LeasedPartitions: leased}
	}
	return nil
}
