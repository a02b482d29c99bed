package outbox_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// A topic's path is fixed at registration, as its partition count is:
// registering it again the other way is refused and changes nothing.
func TestForwardOnlyIsFixedAtRegistration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	if err := outbox.RegisterTopic(ctx, e.Pool, e.Schema, "orders", 4, outbox.ForwardOnly()); err != nil {
		t.Fatal(err)
	}
	if err := outbox.RegisterTopic(ctx, e.Pool, e.Schema, "orders", 4, outbox.ForwardOnly()); err != nil {
		t.Fatalf("the same registration again: %v", err)
	}
	e.Register("payments", 4)
	for _, c := range []struct {
		topic string
		opts  []outbox.TopicOption
	}{{"orders", nil}, {"payments", []outbox.TopicOption{outbox.ForwardOnly()}}} {
		err := outbox.RegisterTopic(ctx, e.Pool, e.Schema, c.topic, 4, c.opts...)
		var ce *outboxtype.ConfigError
		if !errors.As(err, &ce) || ce.Field != "ForwardOnly" || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Fatalf("%s registered the other way: %v, want a *ConfigError on ForwardOnly", c.topic, err)
		}
	}
	if n := e.Int(`SELECT count(*) FROM ` + e.Schema + `.topics WHERE forward_only`); n != 1 {
		t.Fatalf("%d forwarder-only topics, want 1 (orders)", n)
	}
}

// The sequencer leaves a forwarder-only topic's messages in pending (its
// Forwarder takes them from there), and a Subscriber refuses the topic.
func TestForwardOnlyTopicIsNotSequencedNorSubscribed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	if err := outbox.RegisterTopic(ctx, e.Pool, e.Schema, "orders", 2, outbox.ForwardOnly()); err != nil {
		t.Fatal(err)
	}
	e.Register("payments", 2)
	e.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("a")), message.NewMessage(watermill.NewUUID(), []byte("b")))
	if n := e.SequenceAll(); n != 0 {
		t.Fatalf("the sequencer moved %d messages of a forwarder-only topic", n)
	}
	e.Publish("payments", message.NewMessage(watermill.NewUUID(), []byte("c")))
	if n := e.SequenceAll(); n != 1 {
		t.Fatalf("the sequencer moved %d messages, want the other topic's 1", n)
	}
	if n := e.Int(`SELECT count(*) FROM ` + e.Schema + `.pending WHERE topic = 'orders'`); n != 2 {
		t.Fatalf("pending holds %d of the forwarder-only topic's messages, want 2", n)
	}
	if n := e.Int(`SELECT count(*) FROM ` + e.Schema + `.log WHERE topic = 'orders'`); n != 0 {
		t.Fatalf("the log holds %d of the forwarder-only topic's messages", n)
	}
	sub := e.Subscriber("readers", nil)
	if _, err := sub.Subscribe(ctx, "orders"); !errors.Is(err, outbox.ErrForwardOnly) {
		t.Fatalf("Subscribe: %v, want ErrForwardOnly", err)
	}
	if _, err := sub.Subscribe(ctx, "payments"); err != nil {
		t.Fatalf("Subscribe to the other topic: %v", err)
	}
}
