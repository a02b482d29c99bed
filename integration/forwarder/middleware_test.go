package forwarder_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// observed is what a test middleware saw of one message's forwarding.
type observed struct {
	key string
	n   int
	err error
}

// observer is a middleware that records every forwarding it wraps, with
// the outcome its inner handler returned, as a metrics or tracing
// middleware would.
type observer struct {
	mu   sync.Mutex
	seen []observed
}

func (o *observer) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		n, _ := strconv.Atoi(msg.Metadata.Get("n"))
		o.mu.Lock()
		o.seen = append(o.seen, observed{key: msg.Metadata.Get(outbox.PublishPartitionKeyMetadata), n: n, err: err})
		o.mu.Unlock()
		return out, err
	}
}

// successes returns, per key, the ns whose forwarding the middleware saw
// succeed, in the order it saw them.
func (o *observer) successes() map[string][]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string][]int{}
	for _, s := range o.seen {
		if s.err == nil {
			out[s.key] = append(out[s.key], s.n)
		}
	}
	return out
}

// Watermill handler middleware sees the forwarder's traffic: each message
// once, in key order, with its real outcome; a header a middleware adds
// arrives on Kafka; Watermill's own Recoverer and CorrelationID work in the
// chain.
func TestMiddlewareSeesEveryMessageAndItsChangesArrive(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 4)
	kc := kafkatest.New(t)
	kt := kc.Topic(t, "orders", 4, nil)
	obs := &observer{}
	stamp := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			msg.Metadata.Set("stamped", "by-middleware")
			middleware.SetCorrelationID("corr-"+msg.UUID, msg)
			return h(msg)
		}
	}
	fwd := fwdtest.StartForwarder(t, e, nil, newKafkaTarget(t, kc, false), []string{"orders"}, to(kt, func(c *forwarder.Config) {
		c.Middlewares = []message.HandlerMiddleware{middleware.Recoverer, obs.middleware, stamp}
	}))
	pub := fwdtest.NewPublisher(t, e)
	for range 10 {
		pub.Round("orders", 20, nil)
	}
	r := &fwdtest.Received{}
	kc.Consume(t, kt, r)
	outboxtest.WaitFor(t, "every message on Kafka", time.Minute, func() bool { return r.Distinct() == pub.Count() })
	r.Check(t, pub.Snapshot(), nil)

	for _, g := range r.Messages() {
		if g.Metadata.Get("stamped") != "by-middleware" || g.Metadata.Get(middleware.CorrelationIDMetadataKey) != "corr-"+g.UUID {
			t.Fatalf("the middleware's metadata did not arrive: %v", g.Metadata)
		}
	}
	total := 0
	for key, ns := range obs.successes() {
		for i, n := range ns {
			if n != i+1 {
				t.Fatalf("key %s: the middleware saw n=%v, want 1..%d in order", key, ns, len(ns))
			}
		}
		total += len(ns)
	}
	if total != pub.Count() {
		t.Fatalf("the middleware saw %d successful forwardings of %d messages", total, pub.Count())
	}
	if s := fwd.Stats(); s.Messages != int64(pub.Count()) {
		t.Fatalf("stats %+v, want %d messages", s, pub.Count())
	}
}

// A middleware that fails or panics makes its message a failed delivery:
// retried, never lost, never overtaken by a later message of its key.
func TestMiddlewareFailureAndPanicAreRetriedInOrder(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 2)
	kc := kafkatest.New(t)
	kt := kc.Topic(t, "orders", 2, nil)
	var failed, panicked atomic.Int32
	flaky := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			key, n := msg.Metadata.Get(outbox.PublishPartitionKeyMetadata), msg.Metadata.Get("n")
			if key == "key-1" && n == "3" && failed.Add(1) <= 2 {
				return nil, errors.New("middleware says no")
			}
			if key == "key-2" && n == "2" && panicked.Add(1) == 1 {
				panic("middleware panics")
			}
			return h(msg)
		}
	}
	fwdtest.StartForwarder(t, e, nil, newKafkaTarget(t, kc, false), []string{"orders"}, to(kt, func(c *forwarder.Config) {
		c.Middlewares = []message.HandlerMiddleware{flaky}
	}))
	pub := fwdtest.NewPublisher(t, e)
	for range 6 {
		pub.Round("orders", 5, nil)
	}
	r := &fwdtest.Received{}
	kc.Consume(t, kt, r)
	outboxtest.WaitFor(t, "every message on Kafka", time.Minute, func() bool { return r.Distinct() == pub.Count() })
	r.Check(t, pub.Snapshot(), nil)
	if failed.Load() < 3 || panicked.Load() < 2 {
		t.Fatalf("the failing middleware ran %d times, the panicking one %d: no retry happened", failed.Load(), panicked.Load())
	}
}

// partialTarget confirms only the first `keep` messages of its first batch
// of at least three, with an error, then passes everything to inner.
type partialTarget struct {
	inner forwarder.Target
	keep  int
	once  atomic.Bool
	alone atomic.Int32 // sends of a single message
}

var errPartial = errors.New("broker refused the rest of the batch")

func (p *partialTarget) Send(ctx context.Context, topic string, batch []*message.Message) (int, error) {
	if len(batch) == 1 {
		p.alone.Add(1)
	}
	if len(batch) >= 3 && p.once.CompareAndSwap(false, true) {
		done, err := p.inner.Send(ctx, topic, batch[:p.keep])
		if err != nil {
			return done, err
		}
		return p.keep, errPartial
	}
	return p.inner.Send(ctx, topic, batch)
}

// A partial send is reported to the right messages: those confirmed see
// nil, the first unconfirmed sees the target's error, the rest ErrNotSent.
// With Watermill's Retry middleware, the failed message is sent again on
// its own (not overtaking anything), and everything arrives in key order.
func TestMiddlewarePartialSendAndRetry(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 1)
	kc := kafkatest.New(t)
	kt := kc.Topic(t, "orders", 1, nil)
	pub := fwdtest.NewPublisher(t, e)
	for range 4 {
		pub.Round("orders", 5, nil) // 20 messages in one partition, before the forwarder starts
	}
	target := &partialTarget{inner: newKafkaTarget(t, kc, false), keep: 2}
	outer, inner := &observer{}, &observer{}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 10 * time.Millisecond}
	fwdtest.StartForwarder(t, e, nil, target, []string{"orders"}, to(kt, func(c *forwarder.Config) {
		c.Middlewares = []message.HandlerMiddleware{outer.middleware, retry.Middleware, inner.middleware}
		c.Subscriber.Tuning.BatchSize = 10
	}))
	r := &fwdtest.Received{}
	kc.Consume(t, kt, r)
	outboxtest.WaitFor(t, "every message on Kafka", time.Minute, func() bool { return r.Distinct() == pub.Count() })
	r.Check(t, pub.Snapshot(), nil)
	if target.alone.Load() == 0 {
		t.Fatal("the Retry middleware never sent a message on its own")
	}
	// Inside Retry, the first batch's outcomes, in seq order: two
	// confirmed, the third refused by the broker, the rest not sent.
	inner.mu.Lock()
	firstOutcome := map[observed]error{} // by key and n
	for _, s := range inner.seen {
		k := observed{key: s.key, n: s.n}
		if _, seen := firstOutcome[k]; !seen {
			firstOutcome[k] = s.err
		}
	}
	inner.mu.Unlock()
	for i := range 10 { // the first batch: rounds 1 and 2, keys 0..4 each
		k := observed{key: "key-" + strconv.Itoa(i%5), n: i/5 + 1}
		got, seen := firstOutcome[k]
		var want error
		switch {
		case i == 2:
			want = errPartial
		case i > 2:
			want = forwarder.ErrNotSent
		}
		if !seen || !errors.Is(got, want) || (want == nil) != (got == nil) {
			t.Fatalf("position %d of the first batch (%s/%d): first outcome %v (seen %v), want %v", i, k.key, k.n, got, seen, want)
		}
	}
	// Outside Retry, every message succeeded once, in seq order.
	outer.mu.Lock()
	defer outer.mu.Unlock()
	if len(outer.seen) != pub.Count() {
		t.Fatalf("the outer middleware saw %d outcomes for %d messages", len(outer.seen), pub.Count())
	}
	for i, s := range outer.seen {
		if s.err != nil {
			t.Fatalf("outcome %d (%s/%d): %v after Retry", i, s.key, s.n, s.err)
		}
		if want := i/5 + 1; s.n != want {
			t.Fatalf("outcome %d is %s/%d: out of seq order", i, s.key, s.n)
		}
	}
}
