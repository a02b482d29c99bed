package kafka_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// DefaultMarshaler gives a tombstone a null value, any other message a
// non-null one (empty for an empty payload), and refuses a tombstone with
// a payload.
func TestDefaultMarshalerNullsOnlyTombstones(t *testing.T) {
	tomb := message.NewMessage("t", nil)
	if err := outbox.Tombstone(tomb); err != nil {
		t.Fatal(err)
	}
	r, err := kafka.DefaultMarshaler{}.Marshal("settings", tomb)
	if err != nil || r.Value != nil {
		t.Fatalf("tombstone: value %#v, %v; want nil", r.Value, err)
	}
	r, err = kafka.DefaultMarshaler{}.Marshal("settings", message.NewMessage("e", nil))
	if err != nil || r.Value == nil || len(r.Value) != 0 {
		t.Fatalf("empty message: value %#v, %v; want empty, not nil", r.Value, err)
	}
	full := message.NewMessage("f", []byte("x"))
	full.Metadata.Set(outbox.MetadataTombstone, "true")
	var me *outboxtype.MessageError
	if _, err := (kafka.DefaultMarshaler{}).Marshal("settings", full); !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) {
		t.Fatalf("tombstone with a payload: %v, want a *MessageError", err)
	}
}
