package outbox_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestTombstoneMarksOnlyAMessageWithoutPayload(t *testing.T) {
	t.Parallel()
	if err := outbox.Tombstone(nil); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("Tombstone(nil) = %v, want ErrInvalidArgument", err)
	}
	full := message.NewMessage("full", []byte("x"))
	var me *outboxtype.MessageError
	if err := outbox.Tombstone(full); !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) {
		t.Fatalf("Tombstone(message with a payload) = %v, want a *MessageError", err)
	}
	if outbox.IsTombstone(full) || full.Metadata.Get(outbox.MetadataTombstone) != "" {
		t.Fatalf("a refused message was marked: %v", full.Metadata)
	}
	bare := &message.Message{UUID: "bare"} // no metadata map
	if err := outbox.Tombstone(bare); err != nil {
		t.Fatal(err)
	}
	if !outbox.IsTombstone(bare) || bare.Metadata.Get(outbox.MetadataTombstone) != "true" {
		t.Fatalf("not marked: %v", bare.Metadata)
	}
	if outbox.IsTombstone(nil) || outbox.IsTombstone(message.NewMessage("plain", nil)) {
		t.Fatal("IsTombstone of nil or of an unmarked message")
	}
}

// The Publisher refuses a bad tombstone with a typed error and writes
// nothing of the call; a good one is written and delivered with its mark
// and no payload.
func TestPublisherRefusesBadTombstones(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("settings", 2)
	pub := e.Publisher(nil)
	keyed := func(uuid, key string, payload string) *message.Message {
		m := message.NewMessage(uuid, []byte(payload))
		if key != "" {
			m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
		}
		return m
	}
	withPayload := keyed("with-payload", "k1", "value")
	withPayload.Metadata.Set(outbox.MetadataTombstone, "true") // Tombstone would refuse it
	keyless := keyed("keyless", "", "")
	if err := outbox.Tombstone(keyless); err != nil {
		t.Fatal(err)
	}
	badMark := keyed("bad-mark", "k1", "")
	badMark.Metadata.Set(outbox.MetadataTombstone, "yes")
	for _, bad := range []*message.Message{withPayload, keyless, badMark} {
		good := keyed("good-"+bad.UUID, "k2", "v")
		var me *outboxtype.MessageError
		err := pub.Publish("settings", good, bad)
		if !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) || me.UUID != bad.UUID {
			t.Fatalf("Publish(%s) = %v, want a *MessageError naming it", bad.UUID, err)
		}
		t.Logf("%s: %v", bad.UUID, err)
	}
	if n := e.Rows("pending"); n != 0 {
		t.Fatalf("%d rows written by refused calls", n)
	}

	tomb := keyed("tomb", "k1", "")
	if err := outbox.Tombstone(tomb); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("settings", keyed("put", "k1", "v1"), tomb); err != nil {
		t.Fatal(err)
	}
	e.SequenceAll()
	rows := e.readLog(t, "settings")
	if len(rows) != 2 || rows[1].UUID != "tomb" {
		t.Fatalf("log: %+v", rows)
	}
	if r := rows[1]; len(r.Payload) != 0 || r.Metadata[outbox.MetadataTombstone] != "true" || r.Key == nil || *r.Key != "k1" {
		t.Fatalf("tombstone stored as %+v", r)
	}
}
