package admin

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// HeldRef names a key held back by a consumer group in one partition
// (key-level isolation): by Key, or, for a keyless message (held alone),
// by its Seq with Key empty.
type HeldRef struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	Key       string `json:"key,omitempty"`
	Seq       int64  `json:"seq,omitempty"`
}

func (r HeldRef) validate() error {
	switch {
	case r.Group == "" || r.Topic == "":
		return fmt.Errorf("%w: a held key needs its group and topic", sentinel.ErrInvalidArgument)
	case r.Partition < 0:
		return fmt.Errorf("%w: partition %d is negative", sentinel.ErrInvalidArgument, r.Partition)
	case r.Key == "" && r.Seq <= 0:
		return fmt.Errorf("%w: name the held key by Key, or a keyless message by its Seq", sentinel.ErrInvalidArgument)
	}
	return nil
}

// keyArgs are the key and seq parameters of the held.sql admin statements.
func (r HeldRef) keyArgs() (key any, seq int64) {
	if r.Key == "" {
		return nil, r.Seq
	}
	return r.Key, 0
}

// RetryHeldNow makes the lease holder retry a held key at once, with a
// fresh count of attempts (MaxAttempts starts over): after fixing what made
// it fail, say. It returns how many messages the key holds, or a
// *NotFoundError (outbox.ErrNotFound) that names what is unknown: the
// topic, the group, its partition, or the key.
func (a *Admin) RetryHeldNow(ctx context.Context, r HeldRef) (int, error) {
	if err := a.constructed(); err != nil {
		return 0, err
	}
	return a.heldAction(ctx, r, "retry now", a.q.HeldRetryNow)
}

// DeadLetterHeld asks the lease holder to take every message a held key
// holds out of the stream, in seq order, through the group's RejectHandler
// (the dead-letter store), as if each had been rejected; the key's newer
// messages then flow again. The request waits in the held row (HeldKey.
// Requested) until a member of the group holding the partition's lease
// carries it out (within about a second while one runs); a member without
// a RejectHandler cannot, and says so in its log. It returns how many
// messages the key holds, or a *NotFoundError as RetryHeldNow.
func (a *Admin) DeadLetterHeld(ctx context.Context, r HeldRef) (int, error) {
	if err := a.constructed(); err != nil {
		return 0, err
	}
	return a.heldAction(ctx, r, "dead-letter", a.q.HeldRequestDeadLetter)
}

func (a *Admin) heldAction(ctx context.Context, r HeldRef, op, stmt string) (n int, err error) {
	ctx, span := startSpan(ctx, "held "+op, r.Group, r.Topic)
	defer func() { span.EndWith(err, changed(n)) }()
	return a.heldActionIn(ctx, r, op, stmt)
}

func (a *Admin) heldActionIn(ctx context.Context, r HeldRef, op, stmt string) (int, error) {
	if err := r.validate(); err != nil {
		return 0, err
	}
	if err := a.check(ctx); err != nil {
		return 0, err
	}
	key, seq := r.keyArgs()
	tag, err := a.cfg.Pool.Exec(ctx, stmt, r.Group, r.Topic, r.Partition, key, seq)
	if err != nil {
		return 0, schemaErr(fmt.Errorf("admin: %s held key %+v: %w", op, r, err), a.cfg.Schema)
	}
	n := int(tag.RowsAffected())
	if n == 0 {
		// Say whether the topic, the group or the key is unknown.
		if err := a.explain(ctx, Scope{Group: r.Group, Topic: r.Topic, Partitions: []int{r.Partition}}, sentinel.ErrNotFound); err != sentinel.ErrNotFound {
			return 0, err
		}
		return 0, &NotFoundError{What: "held key", Group: r.Group, Topic: r.Topic, Partitions: []int{r.Partition}, Key: r.Key, Seq: r.Seq}
	}
	a.logger.Info("Held key: "+op, watermill.LogFields{"group": r.Group, "topic": r.Topic, "partition": r.Partition, "key": r.Key, "seq": r.Seq, "messages": n})
	return n, nil
}

// HeldHead is the first message of a held key: the one retried.
type HeldHead struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	Seq       int64  `json:"seq"`
	// UUID and Payload are the message's; Missing when the log or its
	// payload's body no longer holds it (UUID "", Payload nil).
	UUID    string `json:"uuid"`
	Payload []byte `json:"payload"`
	Missing bool   `json:"missing,omitempty"`
}

// HeldHeads returns the head message of every held key of f's group and
// topic (each optional), with its payload, in the order Status lists the
// held keys (HeadSeq): for reading what a key is held on. Status leaves
// payloads out, as they may be large.
func (a *Admin) HeldHeads(ctx context.Context, f Filter) (heads []HeldHead, err error) {
	if ctx == nil {
		return nil, errs.NilArgument("admin.HeldHeads: ctx", "pass a context")
	}
	if err := a.check(ctx); err != nil {
		return nil, err
	}
	ctx, span := startSpan(ctx, "held heads", f.Group, f.Topic)
	defer func() { span.EndWith(err) }()
	rows, err := a.cfg.Pool.Query(ctx, a.q.HeldHeads, f.Group, f.Topic)
	if err != nil {
		return nil, schemaErr(fmt.Errorf("admin: held heads: %w", err), a.cfg.Schema)
	}
	defer rows.Close()
	for rows.Next() {
		var h HeldHead
		if err := rows.Scan(&h.Group, &h.Topic, &h.Partition, &h.Seq, &h.UUID, &h.Payload, &h.Missing); err != nil {
			return nil, fmt.Errorf("admin: held heads: %w", err)
		}
		heads = append(heads, h)
	}
	if err := rows.Err(); err != nil {
		return nil, schemaErr(fmt.Errorf("admin: held heads: %w", err), a.cfg.Schema)
	}
	return heads, nil
}
