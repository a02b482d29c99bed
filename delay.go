package outbox

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Delayed delivery: a message published with DeliverAt or DeliverAfter is
// not sequenced, and so not delivered (nor forwarded: it stays in the
// outbox), before its time. By default the later messages of its key wait
// behind it, since order per key is the outbox's promise; a message
// without a key, or marked Unordered, neither waits nor holds others back.
// The sequencer wakes at the earliest time due (an index, not a poll per
// message); docs/architecture.md, "Delayed delivery".
const (
	// metadataDeliverAt carries a delayed message's time (RFC 3339, UTC),
	// set by DeliverAt and DeliverAfter and kept on delivery (DeliveryTime
	// reads it).
	metadataDeliverAt = "outbox_deliver_at"
	// metadataUnordered marks a message that does not keep its order with
	// the delayed messages of its key (Unordered).
	metadataUnordered = "outbox_unordered"
)

// DeliverAt makes msg a delayed message: it is not delivered before t.
// The later messages of its key are delivered after it (they wait), unless
// it has no key or is marked Unordered. t must not be in the past
// (ErrInvalidArgument): publish without DeliverAt to deliver at once. The
// time is metadata "outbox_deliver_at" (RFC 3339, UTC), kept on delivery:
// DeliveryTime reads it.
func DeliverAt(msg *message.Message, t time.Time) error {
	if msg == nil {
		return errs.NilArgument("outbox.DeliverAt: msg", "pass the message to delay")
	}
	if t.IsZero() {
		return fmt.Errorf("%w: outbox.DeliverAt: message %s: a zero time: pass when it is due", ErrInvalidArgument, msg.UUID)
	}
	if now := time.Now(); t.Before(now) {
		return fmt.Errorf("%w: outbox.DeliverAt: message %s: %s is %s in the past: publish without DeliverAt to deliver at once",
			ErrInvalidArgument, msg.UUID, t.UTC().Format(time.RFC3339Nano), now.Sub(t).Round(time.Millisecond))
	}
	msg.Metadata.Set(metadataDeliverAt, t.UTC().Format(time.RFC3339Nano))
	return nil
}

// DeliverAfter is DeliverAt(msg, time.Now().Add(d)); d must be positive.
func DeliverAfter(msg *message.Message, d time.Duration) error {
	if msg == nil {
		return errs.NilArgument("outbox.DeliverAfter: msg", "pass the message to delay")
	}
	if d <= 0 {
		return fmt.Errorf("%w: outbox.DeliverAfter: message %s: a delay of %s: pass a positive one, or publish without it", ErrInvalidArgument, msg.UUID, d)
	}
	return DeliverAt(msg, time.Now().Add(d))
}

// Unordered marks msg as outside its key's order with delayed messages: it
// does not wait behind a delayed message of its key, and, delayed itself,
// holds none back. Its order with the key's other undelayed messages is
// kept as usual. The mark is metadata "outbox_unordered".
func Unordered(msg *message.Message) error {
	if msg == nil {
		return errs.NilArgument("outbox.Unordered: msg", "pass the message to mark")
	}
	msg.Metadata.Set(metadataUnordered, "true")
	return nil
}

// DeliveryTime returns the time a delayed message was published for (ok
// false when it was not delayed, or its metadata does not hold a time).
func DeliveryTime(msg *message.Message) (t time.Time, ok bool) {
	if msg == nil {
		return time.Time{}, false
	}
	v := msg.Metadata.Get(metadataDeliverAt)
	if v == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}

// checkDelay refuses, before anything is written, a message whose
// metadataDeliverAt is not a time (set by hand, not by DeliverAt).
func checkDelay(m *message.Message) error {
	if v := m.Metadata.Get(metadataDeliverAt); v != "" {
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
			return &outboxtype.MessageError{UUID: m.UUID, Reason: fmt.Sprintf("metadata %s %q is not an RFC 3339 time: set it with outbox.DeliverAt", metadataDeliverAt, v)}
		}
	}
	return nil
}
