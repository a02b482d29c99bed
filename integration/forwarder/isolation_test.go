package forwarder_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// With key isolation, a message whose forwarding fails for reasons of its
// own (a middleware) is held with its key while the other keys reach
// Kafka; a broker that fails every send holds no key: the partition backs
// off as without isolation. Exactly-once delivery refuses isolation.
func TestForwarderKeyIsolation(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 1)
	kc := kafkatest.New(t)
	kt := kc.Topic(t, "orders", 1, nil)

	_, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, KeyIsolation: outbox.KeyIsolation{Enabled: true}},
		Topics:     []string{"orders"},
		Target:     newKafkaTarget(t, kc, false),
	}, nil)
	var ce *outboxtype.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Subscriber.KeyIsolation" {
		t.Fatalf("isolation with exactly-once delivery: %v, want a ConfigError on Subscriber.KeyIsolation", err)
	}

	var fixed, brokerDown atomic.Bool
	blocked := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if msg.Metadata.Get(outbox.PublishPartitionKeyMetadata) == "key-0" && !fixed.Load() {
				return nil, errors.New("no route for key-0 yet")
			}
			return h(msg)
		}
	}
	target := &switchableTarget{inner: newKafkaTarget(t, kc, true), down: &brokerDown}
	fwdtest.StartForwarder(t, e, nil, target, []string{"orders"}, to(kt, func(c *forwarder.Config) {
		c.Subscriber.KeyIsolation.Enabled = true
		c.Middlewares = []message.HandlerMiddleware{blocked}
	}))
	pub := fwdtest.NewPublisher(t, e)
	for range 5 {
		pub.Round("orders", 4, nil)
	}
	r := &fwdtest.Received{}
	kc.Consume(t, kt, r)
	outboxtest.WaitFor(t, "keys 1-3 on Kafka while key-0 is held", time.Minute, func() bool { return r.Distinct() == 15 })
	// (A batch reaches Kafka before the scan moves past it with the rows it
	// parks, in one commit: the last of key-0's rows may come a moment later.)
	outboxtest.WaitFor(t, "key-0's 5 messages held", 10*time.Second, func() bool { return e.Rows("held") == 5 })
	if n := r.Distinct(); n != 15 {
		t.Fatalf("%d messages on Kafka while key-0 is held, want 15", n)
	}

	// The broker fails every send: the partition blocks, no key is held.
	brokerDown.Store(true)
	pub.Round("orders", 4, nil)
	outboxtest.WaitFor(t, "the failing sends counted on the cursor", 30*time.Second, func() bool {
		return e.Int("SELECT attempts FROM "+e.Schema+".cursors WHERE topic = 'orders'") >= 2
	})
	if n := e.Int("SELECT count(DISTINCT coalesce(partition_key, seq::text)) FROM " + e.Schema + ".held"); n != 1 {
		t.Fatalf("%d keys held while the broker is down, want only key-0", n)
	}
	brokerDown.Store(false)
	fixed.Store(true)
	outboxtest.WaitFor(t, "every message on Kafka", time.Minute, func() bool { return r.Distinct() == pub.Count() })
	r.Check(t, pub.Snapshot(), nil)
	outboxtest.WaitFor(t, "nothing held", 10*time.Second, func() bool { return e.Rows("held") == 0 })
}

// switchableTarget fails every send while down is set, as a broker that is
// unreachable.
type switchableTarget struct {
	inner forwarder.Target
	down  *atomic.Bool
}

func (s *switchableTarget) Send(ctx context.Context, topic string, batch []*message.Message) (int, error) {
	if s.down.Load() {
		return 0, errors.New("kafka: client has run out of available brokers to talk to")
	}
	return s.inner.Send(ctx, topic, batch)
}
