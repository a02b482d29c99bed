package admin

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
)

// DeleteGroupOptions tune DeleteGroup.
type DeleteGroupOptions struct {
	// Topic limits the deletion to the group's cursors and members on one
	// topic ("" for all its topics).
	Topic string
	// Force deletes the group even while it has live members or leases.
	// Their workers' next cursor write fails (the lease is gone) and they
	// stop working on the group's partitions; a member that keeps running
	// and joins again starts the group afresh (from the oldest retained
	// message, or the newest with StartFromNewest).
	Force bool
	// DeadLetters also deletes the group's dead-letter entries (of the
	// topic, with Topic set). By default they are kept: they are the only
	// copy of the poison messages once retention deleted the log rows.
	DeadLetters bool
}

// DeletedGroup says what DeleteGroup removed.
type DeletedGroup struct {
	Group       string `json:"group"`
	Cursors     int64  `json:"cursors"`
	Members     int64  `json:"members"`
	DeadLetters int64  `json:"dead_letters"`
}

// DeleteGroup removes a consumer group: its cursors (and so its hold on
// retention: the next vacuum can delete what only this group kept) and its
// member rows, on one topic or all of them, in one transaction. A group
// with a live member (a heartbeat within Config.MemberTimeout) or an
// unexpired lease is refused with a *GroupActiveError (ErrGroupActive)
// unless opts.Force; a group with nothing to delete gives ErrNotFound.
func (a *Admin) DeleteGroup(ctx context.Context, group string, opts DeleteGroupOptions) (DeletedGroup, error) {
	if err := (Scope{Group: group, Topic: opts.Topic}).validate(); err != nil {
		return DeletedGroup{}, err
	}
	if err := a.check(ctx); err != nil {
		return DeletedGroup{}, err
	}
	out := DeletedGroup{Group: group}
	err := pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		// Lock the group's cursors, so that no lease is taken meanwhile.
		var leased int
		var rows int64
		if err := tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE lease_owner IS NOT NULL AND lease_expires_at > now())
			FROM (SELECT lease_owner, lease_expires_at FROM `+a.s+`.cursors
				WHERE group_name = $1 AND ($2 = '' OR topic = $2) FOR UPDATE) c`, group, opts.Topic).Scan(&rows, &leased); err != nil {
			return fmt.Errorf("admin: delete group: lock cursors: %w", err)
		}
		live, err := a.liveMembers(ctx, tx, group, opts.Topic)
		if err != nil {
			return err
		}
		if (len(live) > 0 || leased > 0) && !opts.Force {
			return &GroupActiveError{Group: group, Members: live, LeasedPartitions: leased}
		}
		tag, err := tx.Exec(ctx, `DELETE FROM `+a.s+`.cursors WHERE group_name = $1 AND ($2 = '' OR topic = $2)`, group, opts.Topic)
		if err != nil {
			return fmt.Errorf("admin: delete group: cursors: %w", err)
		}
		out.Cursors = tag.RowsAffected()
		if tag, err = tx.Exec(ctx, `DELETE FROM `+a.s+`.members WHERE group_name = $1 AND ($2 = '' OR topic = $2)`, group, opts.Topic); err != nil {
			return fmt.Errorf("admin: delete group: members: %w", err)
		}
		out.Members = tag.RowsAffected()
		if opts.DeadLetters {
			if tag, err = tx.Exec(ctx, `DELETE FROM `+a.s+`.dead_letters WHERE group_name = $1 AND ($2 = '' OR topic = $2)`, group, opts.Topic); err != nil {
				return fmt.Errorf("admin: delete group: dead letters: %w", err)
			}
			out.DeadLetters = tag.RowsAffected()
		}
		if out.Cursors == 0 && out.Members == 0 && out.DeadLetters == 0 {
			return fmt.Errorf("%w: consumer group %q has no cursors or members%s", ErrNotFound, group, topicSuffix(opts.Topic))
		}
		return nil
	})
	if err != nil {
		return DeletedGroup{}, schemaErr(err, a.cfg.Schema)
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

// liveMembers lists the group's members whose heartbeat is within
// MemberTimeout.
func (a *Admin) liveMembers(ctx context.Context, tx pgx.Tx, group, topic string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT DISTINCT member_id FROM `+a.s+`.members
		WHERE group_name = $1 AND ($2 = '' OR topic = $2) AND heartbeat_at > now() - $3::int8 * interval '1 microsecond'
		ORDER BY member_id`, group, topic, a.cfg.MemberTimeout.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("admin: live members: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
