package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Reject marks msg, a message delivered by a Subscriber, as poison because of
// cause, and returns an error matching both ErrPoison and cause, so that a
// handler can end with `return outbox.Reject(msg, err)`. Whether the handler
// then acks or nacks, the Subscriber hands the message to its RejectHandler
// (e.g. the dead-letter store) in the same transaction that moves the cursor
// past the message, shrinks the batch at once and goes on without backoff.
// A Subscriber without a RejectHandler retries the message instead (and
// logs a warning); use RejectTo to name the handler at the call site.
//
// A nil msg is a programming error reported as ErrInvalidMessage.
func Reject(msg *message.Message, cause error) error {
	return RejectTo(msg, cause, nil)
}

// RejectTo is Reject with the RejectHandler that takes the message out
// (e.g. a deadletter.Store), for a Subscriber configured without one:
// wiring the store once, where the message is rejected, is enough. With
// h nil it is Reject. The handler runs as a RejectHandler does, in the
// transaction that moves the cursor past the message.
func RejectTo(msg *message.Message, cause error, h outboxtype.RejectHandler) error {
	return consumer.Reject(msg, cause, h)
}

// QuietRejects is a Router middleware (router.AddMiddleware) for handlers
// that reject with `return outbox.Reject(msg, err)`: it answers a
// rejection of a message a Subscriber delivered with an ack instead of the
// error, so that the Router neither logs a deliberate rejection as a
// failed handler ("Handler returned error", at ERROR) nor hands it to the
// retries of its other middleware. The Subscriber takes the message out
// as it would anyway (its RejectHandler, a dead letter by default). Any
// other error, and a rejection of a message no Subscriber delivered, pass
// through unchanged. Add it last, so that it wraps the handler first.
func QuietRejects(h message.HandlerFunc) message.HandlerFunc {
	if h == nil {
		return func(*message.Message) ([]*message.Message, error) {
			return nil, fmt.Errorf("%w: outbox.QuietRejects was given a nil handler", ErrInvalidArgument)
		}
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil && errors.Is(err, ErrPoison) && consumer.IsRejected(msg) {
			return out, nil
		}
		return out, err
	}
}

// IsDelivered reports whether msg was delivered by a Subscriber (so Reject
// on it reaches the Subscriber).
func IsDelivered(msg *message.Message) bool { return consumer.IsDelivered(msg) }

// schemaDeadLetters is the default RejectHandler: the dead-letter table of
// the Subscriber's own schema, written in the rejecting transaction as
// deadletter.Store writes it.
type schemaDeadLetters struct {
	pool   *pgxpool.Pool
	schema string
}

// HandleReject implements outboxtype.RejectHandler.
func (d schemaDeadLetters) HandleReject(ctx context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
	if tx == nil {
		return ErrNilTx
	}
	q, err := pgexec.FromTx(tx)
	if err != nil {
		return err
	}
	if err := schemacheck.Check(ctx, d.pool, q, d.schema); err != nil {
		return err
	}
	_, err = consumer.InsertDeadLetter(ctx, tx, dbsql.For(d.schema), m, consumer.DefaultMaxReasonBytes)
	return schemacheck.Wrap(err, d.schema)
}
