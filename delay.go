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
	// unorderedMark is metadataUnordered's one value (Publish refuses any
	// other: the SQL reads the key's presence, so "false" would mean true).
	unorderedMark = "true"
)

// DeliverAt makes msg a delayed message: it is not delivered before t.
// The later messages of its key are delivered after it (they wait), unless
// it has no key or is marked Unordered: a delay of 30 s on one message of
// a key delays every later message of that key by up to 30 s. t must not
// be in the past (publish without DeliverAt to deliver at once), nor after
// the year 9999 (RFC 3339's last); either is refused with an error
// matching ErrInvalidArgument, and msg is left unchanged. The time is
// metadata "outbox_deliver_at" (RFC 3339, UTC), kept on delivery:
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
	return setDeliverAt("outbox.DeliverAt", msg, t)
}

// DeliverAfter is DeliverAt(msg, time.Now().Add(d)); d must be positive.
// However short d is, the message is due d after the call: it is never
// refused as "in the past".
func DeliverAfter(msg *message.Message, d time.Duration) error {
	if msg == nil {
		return errs.NilArgument("outbox.DeliverAfter: msg", "pass the message to delay")
	}
	if d <= 0 {
		return fmt.Errorf("%w: outbox.DeliverAfter: message %s: a delay of %s: pass a positive one, or publish without it", ErrInvalidArgument, msg.UUID, d)
	}
	return setDeliverAt("outbox.DeliverAfter", msg, time.Now().Add(d))
}

// lastDeliverAt is the latest time a delayed message can be due: the end
// of the year 9999, the last an RFC 3339 time can write.
var lastDeliverAt = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)

// setDeliverAt writes t into msg's metadata, once it is known to be
// representable.
func setDeliverAt(fn string, msg *message.Message, t time.Time) error {
	if t.After(lastDeliverAt) {
		return fmt.Errorf("%w: %s: message %s: %s is after the year 9999, the last an RFC 3339 time (and so the outbox) can store: pass an earlier time",
			ErrInvalidArgument, fn, msg.UUID, t.UTC().Format(time.RFC3339))
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	msg.Metadata.Set(metadataDeliverAt, t.UTC().Format(time.RFC3339Nano))
	return nil
}

// Unordered marks msg as outside its key's order with delayed messages: it
// does not wait behind a delayed message of its key, and, delayed itself,
// holds none back. Its order with the key's other undelayed messages is
// kept as usual. The mark is metadata "outbox_unordered".
func Unordered(msg *message.Message) error {
	if msg == nil {
		return errs.NilArgument("outbox.Unordered: msg", "pass the message to mark")
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	msg.Metadata.Set(metadataUnordered, unorderedMark)
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

// checkDelay refuses, before anything is written, a message whose delay
// metadata was set by hand, not by DeliverAt and Unordered, to something
// the outbox would misread: a metadataDeliverAt that is not an RFC 3339
// time (empty included), or a metadataUnordered other than "true" (the
// outbox reads the key's presence: "false" would be taken as true).
func checkDelay(m *message.Message) error {
	if v, ok := m.Metadata[metadataDeliverAt]; ok {
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
			return &outboxtype.MessageError{UUID: m.UUID, Reason: fmt.Sprintf("metadata %s %q is not an RFC 3339 time: set it with outbox.DeliverAt, or delete the key to deliver at once", metadataDeliverAt, v)}
		}
	}
	if v, ok := m.Metadata[metadataUnordered]; ok && v != unorderedMark {
		return &outboxtype.MessageError{UUID: m.UUID, Reason: fmt.Sprintf("metadata %s is %q: the outbox reads the key's presence as unordered, so only %q is accepted: mark it with outbox.Unordered, or delete the key to keep the order", metadataUnordered, v, unorderedMark)}
	}
	return nil
}
