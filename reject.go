package outbox

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/consumer"
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
func RejectTo(msg *message.Message, cause error, h RejectHandler) error {
	return consumer.Reject(msg, cause, h)
}

// RejectedMessage is a message taken out of its stream as poison: what a
// RejectHandler receives.
type RejectedMessage = consumer.RejectedMessage

// RejectHandler takes rejected messages out of the stream, typically into a
// dead-letter store. HandleReject runs in tx, the transaction that also
// moves the group's cursor past the message, so the message is stored as
// rejected if and only if the cursor moves. An error keeps the message in
// the stream (it is retried like a Nack).
type RejectHandler = consumer.RejectHandler

// RejectHandlerFunc adapts a function to RejectHandler.
type RejectHandlerFunc = consumer.RejectHandlerFunc

// IsDelivered reports whether msg was delivered by a Subscriber (so Reject
// on it reaches the Subscriber).
func IsDelivered(msg *message.Message) bool { return consumer.IsDelivered(msg) }
