package admin_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Status says which path a topic takes, and a forwarder-only topic's
// backlog (its pending messages) counts in its group's lag although its
// cursors stand at the heads.
func TestStatusSaysWhichPathATopicTakes(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	if err := outbox.RegisterTopic(ctx, e.Pool, e.Schema, "payments", 2, outbox.ForwardOnly()); err != nil {
		t.Fatal(err)
	}
	e.Register("orders", 2)
	e.Publish("payments", message.NewMessage(watermill.NewUUID(), []byte("a")), message.NewMessage(watermill.NewUUID(), []byte("b")))
	e.Exec(`INSERT INTO ` + e.Schema + `.cursors (group_name, topic, partition) VALUES ('outbox-forwarder', 'payments', 0), ('outbox-forwarder', 'payments', 1)`)
	rep, err := e.admin.Status(ctx, admin.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]bool{}
	for _, tp := range rep.Topics {
		paths[tp.Topic] = tp.ForwardOnly
		if tp.Topic != "payments" {
			continue
		}
		if tp.Unsequenced != 2 || tp.Sequenced != 0 {
			t.Fatalf("payments: %d forwarded, %d pending; want 0 and 2", tp.Sequenced, tp.Unsequenced)
		}
		if len(tp.Groups) != 1 || tp.Groups[0].Lag != 2 {
			t.Fatalf("payments' groups %+v: want the forwarder's with lag 2", tp.Groups)
		}
	}
	if !paths["payments"] || paths["orders"] {
		t.Fatalf("forwarder-only: %v, want payments only", paths)
	}
	// No log to replay: a reset of its cursors is refused, nothing moves.
	if _, err := e.admin.ResetCursor(ctx, admin.Scope{Group: "outbox-forwarder", Topic: "payments"}, admin.ToSeq(0)); !errors.Is(err, outbox.ErrInvalidArgument) || !strings.Contains(err.Error(), "forwarder-only") {
		t.Fatalf("ResetCursor of a forwarder-only topic: %v, want ErrInvalidArgument", err)
	}
}
