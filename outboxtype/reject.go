package outboxtype

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// RejectedMessage is a message taken out of its stream as poison: what a
// RejectHandler receives (outbox.Reject, or a message that ran out of
// SubscriberConfig.MaxAttempts).
type RejectedMessage struct {
	Group        string            // the consumer group that rejected it
	Topic        string            // its outbox topic
	Partition    int               // its partition
	Seq          int64             // its place in the partition
	UUID         string            // its message UUID
	PartitionKey string            // its partition key ("" for none)
	Metadata     map[string]string // its metadata, as published
	Payload      []byte            // its payload, as published
	// Reason is the cause given to Reject (or the last handler failure when
	// the message ran out of attempts).
	Reason error
	// Attempts is how many times the message was delivered: every
	// hand-out to a handler, a delivery a crash of the consumer process
	// cut short included. MaxAttempts counts failures (a nack, an error,
	// a timeout, a crash the message caused alone); a delivery a crash
	// cut short while other deliveries were in flight in the process is
	// nobody's failure, so Attempts can exceed MaxAttempts, and the
	// reason then says by how many (docs/failure-modes.md §3).
	Attempts int
	// FirstFailure and LastFailure bound the failures seen for it.
	FirstFailure, LastFailure time.Time
}

// RejectHandler takes rejected messages out of the stream, typically into a
// dead-letter store (deadletter.Store is one). HandleReject runs in tx, the
// transaction that also moves the group's cursor past the message, so the
// message is stored as rejected if and only if the cursor moves. An error
// keeps the message in the stream (it is retried like a Nack).
type RejectHandler interface {
	HandleReject(ctx context.Context, tx pgx.Tx, m RejectedMessage) error
}

// RejectHandlerFunc adapts a function to RejectHandler.
type RejectHandlerFunc func(ctx context.Context, tx pgx.Tx, m RejectedMessage) error

// HandleReject calls f. A nil f is an error matching outbox.ErrInvalidArgument
// (the message stays in the stream).
func (f RejectHandlerFunc) HandleReject(ctx context.Context, tx pgx.Tx, m RejectedMessage) error {
	if f == nil {
		return fmt.Errorf("%w: the RejectHandlerFunc is nil: give the Subscriber a function, or no RejectHandler at all", sentinel.ErrInvalidArgument)
	}
	return f(ctx, tx, m)
}
