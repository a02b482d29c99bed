package deadletter_test

import (
	"errors"
	"strings"
	"testing"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// An entry is replayed whatever its size: the Publisher's size limits
// (MaxMetadataBytes, 64 KiB by default) are for new messages, and a message
// from another broker can carry more metadata than that.
func TestReplayIgnoresThePublishersSizeLimits(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	ctx := outboxtest.Ctx(t)
	big := strings.Repeat("h", outbox.DefaultMaxMetadataBytes+1)
	if _, err := e.store.Add(ctx, outboxtype.RejectedMessage{Group: "g", Topic: "orders", UUID: "u", Metadata: map[string]string{"big": big}, Payload: []byte("x"), Reason: errors.New("x")}); err != nil {
		t.Fatal(err)
	}
	page, err := e.store.List(ctx, deadletter.ListOptions{})
	if err != nil || len(page.Entries) != 1 {
		t.Fatalf("List: %v, %d entries", err, len(page.Entries))
	}
	if _, err := e.store.Replay(ctx, page.Entries[0].ID, deadletter.ReplayOptions{}); err != nil {
		t.Fatalf("Replay of an entry with %d bytes of metadata: %v", len(big), err)
	}
	if n := e.Int("SELECT count(*) FROM "+e.Schema+".pending WHERE length(metadata->>'big') = $1", len(big)); n != 1 {
		t.Fatalf("%d replayed messages with the metadata, want 1", n)
	}
}
