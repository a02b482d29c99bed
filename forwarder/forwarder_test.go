package forwarder_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

func TestConfigValidation(t *testing.T) {
	e := fwdtest.NewEnv(t)
	target := forwarder.TargetFunc(func(context.Context, string, []*message.Message) (int, error) { return 0, nil })
	valid := forwarder.Config{Subscriber: outbox.SubscriberConfig{Pool: e.Pool}, Topics: []string{"orders"}, Target: target}
	if err := valid.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, edit := range map[string]func(*forwarder.Config){
		"no pool":         func(c *forwarder.Config) { c.Subscriber.Pool = nil },
		"no topics":       func(c *forwarder.Config) { c.Topics = nil },
		"bad topic":       func(c *forwarder.Config) { c.Topics = []string{"a b"} },
		"topic twice":     func(c *forwarder.Config) { c.Topics = []string{"a", "a"} },
		"no target":       func(c *forwarder.Config) { c.Target = nil },
		"transactional":   func(c *forwarder.Config) { c.Subscriber.Strategy = outbox.Transactional },
		"empty mapping":   func(c *forwarder.Config) { c.TargetTopic = func(string) string { return "" } },
		"negative budget": func(c *forwarder.Config) { c.Subscriber.HandlerTimeout = -time.Second },
		"nil middleware":  func(c *forwarder.Config) { c.Middlewares = []message.HandlerMiddleware{nil} },
	} {
		c := valid
		edit(&c)
		if err := c.Validate(); !errors.Is(err, outbox.ErrInvalidConfig) && !errors.Is(err, outbox.ErrInvalidName) {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := forwarder.NewForwarder(c, nil); err == nil {
			t.Errorf("%s: NewForwarder accepted it", name)
		}
	}
}

// flakyPublisher publishes through inner one message at a time, in order,
// and stops at the first message with metadata "fail" (a permanent error)
// or, every third call, after the first message (a transient one).
type flakyPublisher struct {
	inner message.Publisher
	calls int
}

var errPermanent = errors.New("permanently refused")

func (p *flakyPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.calls++
	for i, m := range msgs {
		if m.Metadata.Get("fail") != "" {
			return errPermanent
		}
		if i == 1 && p.calls%3 == 0 {
			return errors.New("transient failure")
		}
		if err := p.inner.Publish(topic, m); err != nil {
			return err
		}
	}
	return nil
}

func (p *flakyPublisher) Close() error { return nil }

// Any Watermill publisher can be the target: here Go channels, with
// transient failures after part of a batch and a message refused for good.
func TestPublisherTarget(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 4)
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true, BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{}) // in order
	defer gc.Close()
	msgs, err := gc.Subscribe(context.Background(), "orders.out")
	if err != nil {
		t.Fatal(err)
	}
	r := &fwdtest.Received{}
	go func() {
		for m := range msgs {
			r.Add(m, -1)
			m.Ack()
		}
	}()
	pub := fwdtest.NewPublisher(t, e)
	var bad string
	for i := 0; i < 20; i++ {
		pub.Round("orders", 8, func(m *message.Message) {
			if m.Metadata.Get("n") == "11" && m.Metadata.Get(outbox.PublishPartitionKeyMetadata) == "key-5" {
				m.Metadata.Set("fail", "yes")
				bad = m.UUID
			}
		})
	}
	// One publisher call at a time (flakyPublisher is not concurrency-safe).
	target := forwarder.NewPublisherTarget(&flakyPublisher{inner: gc}, func(err error) bool { return errors.Is(err, errPermanent) })
	fwd := fwdtest.StartForwarder(t, e, nil, serialized(target), []string{"orders"}, func(c *forwarder.Config) {
		c.TargetTopic = func(topic string) string { return topic + ".out" }
	})
	outboxtest.WaitFor(t, "every message forwarded or dead-lettered", time.Minute, func() bool {
		return r.Distinct() == pub.Count()-1 && len(e.DeadLettered(t)) == 1
	})
	dead := e.DeadLettered(t)
	if dead[bad] == "" {
		t.Fatalf("dead letters %v, want %s", dead, bad)
	}
	dups := r.Check(t, pub.Snapshot(), dead)
	st := fwd.Stats()
	t.Logf("%d duplicates; stats %+v", dups, st)
	if st.Rejected != 1 || st.Failures < 2 {
		t.Fatalf("stats %+v", st)
	}
}

func serialized(t forwarder.Target) forwarder.Target {
	sem := make(chan struct{}, 1)
	return forwarder.TargetFunc(func(ctx context.Context, topic string, batch []*message.Message) (int, error) {
		sem <- struct{}{}
		defer func() { <-sem }()
		return t.Send(ctx, topic, batch)
	})
}

// One Send ends at the Subscriber's HandlerTimeout (it had a SendTimeout of
// its own, defaulting to it): a target that waits for its context gets a
// deadline that far after the batch was handed over, and the failed send
// counts as a timeout. The hand-over comes after the message was published
// and before Send starts, so the deadline lies between those two times
// plus HandlerTimeout, however slow the machine.
func TestASendEndsAtTheHandlerTimeout(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 1)
	const timeout = 400 * time.Millisecond
	type call struct {
		start, deadline time.Time // zero deadline: none
		err             error
	}
	calls := make(chan call, 16)
	target := forwarder.TargetFunc(func(ctx context.Context, _ string, _ []*message.Message) (int, error) {
		start := time.Now()
		dl, ok := ctx.Deadline()
		if !ok {
			calls <- call{start: start}
			return 0, errors.New("no deadline")
		}
		<-ctx.Done()
		calls <- call{start: start, deadline: dl, err: ctx.Err()}
		return 0, ctx.Err()
	})
	fwd := fwdtest.StartForwarder(t, e, nil, target, []string{"orders"}, func(c *forwarder.Config) {
		c.Subscriber.HandlerTimeout = timeout
	})
	published := time.Now()
	fwdtest.NewPublisher(t, e).Round("orders", 1, nil)
	select {
	case c := <-calls:
		if c.deadline.IsZero() {
			t.Fatal("Send's context has no deadline")
		}
		if c.deadline.After(c.start.Add(timeout)) || c.deadline.Before(published.Add(timeout)) || !errors.Is(c.err, context.DeadlineExceeded) {
			t.Fatalf("Send's context ended %v after it started, %v after the publish (%v), want HandlerTimeout %v after the hand-over, between the two",
				c.deadline.Sub(c.start), c.deadline.Sub(published), c.err, timeout)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no send")
	}
	outboxtest.WaitFor(t, "the failed send counted", 10*time.Second, func() bool { return fwd.Stats().Failures >= 1 })
}
