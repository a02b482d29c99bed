package pipeline_test

import (
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/pipeline"
)

// A delayed message is held in the outbox until its time and forwarded
// then, with the later message of its key after it; another key's message
// is forwarded at once.
func TestPipelineForwardsADelayedMessageWhenDue(t *testing.T) {
	b := outboxtest.Setup(t)
	b.Register("orders", 2)
	br := newBroker()
	p, err := pipeline.New(pipeline.Config{Schema: b.Schema, Pool: b.Pool,
		Forward: forwarder.Config{Topics: []string{"orders"}, Target: br}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	start(t, p)
	due := time.Now().Add(time.Second)
	d := outboxtest.Keyed("a1-delayed", "a", 1, "x")
	if err := outbox.DeliverAt(d, due); err != nil {
		t.Fatal(err)
	}
	b.Publish("orders", d, outboxtest.Keyed("a2", "a", 2, "x"), outboxtest.Keyed("b1", "b", 1, "x"))
	outboxtest.WaitFor(t, "b1 forwarded at once", 10*time.Second, func() bool { return br.count("orders") >= 1 })
	if n := br.count("orders"); time.Now().Before(due) && n != 1 {
		t.Fatalf("%d forwarded before the time, want only b1", n)
	}
	outboxtest.WaitFor(t, "a's messages forwarded once due", 10*time.Second, func() bool { return br.count("orders") == 3 })
	if time.Now().Before(due) {
		t.Fatal("forwarded before the time")
	}
	br.mu.Lock()
	defer br.mu.Unlock()
	got := []string{br.got["orders"][0].UUID, br.got["orders"][1].UUID, br.got["orders"][2].UUID}
	if got[0] != "b1" || got[1] != "a1-delayed" || got[2] != "a2" {
		t.Fatalf("forwarded in the order %v, want [b1 a1-delayed a2]", got)
	}
}
