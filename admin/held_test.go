package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// HeldHeads returns the head message of each held key with its payload
// (inline or kept in bodies), the key's later messages left out, in the
// order of Status.
func TestHeldHeadsHaveTheHeadsPayloads(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 1)
	big := strings.Repeat("b", 4096) // kept in bodies
	e.Publish("orders", outboxtest.Keyed("a1", "a", 1, "first of a"), outboxtest.Keyed("b1", "b", 1, big), outboxtest.Keyed("a2", "a", 2, "second of a"),
		outboxtest.Keyed("c1", "c", 1, "flows"))
	store, err := deadletter.NewStore(deadletter.Config{Schema: e.Schema, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.HoldingConsumer("billing", "orders", store, "a", "b")
	outboxtest.WaitFor(t, "keys a and b held", 30*time.Second, func() bool { return e.Rows("held") == 3 })

	heads, err := e.admin.HeldHeads(context.Background(), admin.Filter{Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if len(heads) != 2 || heads[0].UUID != "a1" || string(heads[0].Payload) != "first of a" || heads[1].UUID != "b1" || string(heads[1].Payload) != big ||
		heads[0].Group != "billing" || heads[0].Topic != "orders" || heads[0].Seq != 1 || heads[0].Missing || heads[1].Missing {
		t.Fatalf("held heads: %+v", heads)
	}
	if heads, err := e.admin.HeldHeads(context.Background(), admin.Filter{Group: "shipping"}); err != nil || len(heads) != 0 {
		t.Fatalf("held heads of a group holding nothing: %v %v", heads, err)
	}
	var none context.Context // a nil context is refused, typed
	if _, err := e.admin.HeldHeads(none, admin.Filter{}); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("a nil context: %v", err)
	}
}
