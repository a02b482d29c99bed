package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/pipeline"
	"github.com/millrace/watermill-outbox/relay"
	"github.com/millrace/watermill-outbox/retention"
)

// The tests run on a throwaway cluster with wal_level = logical (the
// relay's test).
func TestMain(m *testing.M) {
	pgtest.MainWith(m, pgcluster.Options{Settings: map[string]string{
		"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10", "wal_writer_delay": "10ms",
	}})
}

// broker is a Target that keeps what it was sent, per topic, and rejects
// as poison the messages whose payload is "poison".
type broker struct {
	mu   sync.Mutex
	got  map[string][]*message.Message
	sent chan struct{}
}

func newBroker() *broker {
	return &broker{got: map[string][]*message.Message{}, sent: make(chan struct{}, 1)}
}

func (b *broker) Send(_ context.Context, topic string, batch []*message.Message) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, m := range batch {
		if string(m.Payload) == "poison" {
			return i, outbox.Reject(m, errors.New("the broker refuses this record for good"))
		}
		b.got[topic] = append(b.got[topic], m)
	}
	select {
	case b.sent <- struct{}{}:
	default:
	}
	return len(batch), nil
}

func (b *broker) count(topic string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.got[topic])
}

// start runs p until the test ends, and fails the test if Run fails.
func start(t *testing.T, p *pipeline.Pipeline) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// What one pipeline gives a service with nothing wired by hand: messages
// sequenced and forwarded in order per key, a message the broker refuses
// dead-lettered into the schema's table, and the forwarded rows deleted by
// retention.
func TestPipelineForwardsDeadLettersAndVacuums(t *testing.T) {
	b := outboxtest.Setup(t)
	b.Register("orders", 4)
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // after the pipeline's own cleanup stopped it
	br := newBroker()
	p, err := pipeline.New(pipeline.Config{
		Schema:    b.Schema,
		Pool:      b.Pool,
		Forward:   forwarder.Config{Topics: []string{"orders"}, Target: br, TargetTopic: func(s string) string { return "shop." + s }},
		Retention: retention.Config{Interval: 50 * time.Millisecond},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	start(t, p)

	const keys, perKey = 5, 20
	var msgs []*message.Message
	for n := 1; n <= perKey; n++ {
		for k := range keys {
			payload := "ok"
			if k == 0 && n == 10 {
				payload = "poison"
			}
			msgs = append(msgs, outboxtest.Keyed(fmt.Sprintf("m-%d-%d", k, n), "key-"+strconv.Itoa(k), n, payload))
		}
	}
	b.Publish("orders", msgs...)

	outboxtest.WaitFor(t, "every healthy message at the broker", 30*time.Second, func() bool { return br.count("shop.orders") == keys*perKey-1 })
	last := map[string]int{}
	for _, m := range br.got["shop.orders"] {
		key := m.Metadata.Get(outbox.PublishPartitionKeyMetadata)
		n, _ := strconv.Atoi(m.Metadata.Get("n"))
		if n <= last[key] {
			t.Fatalf("key %s: message %d after %d", key, n, last[key])
		}
		last[key] = n
	}
	outboxtest.WaitFor(t, "the poison message in the schema's dead_letters", 30*time.Second, func() bool {
		return b.Int("SELECT count(*) FROM "+b.Schema+".dead_letters WHERE uuid = 'm-0-10'") == 1
	})
	outboxtest.WaitFor(t, "retention to delete the forwarded rows", 30*time.Second, func() bool {
		return b.Int("SELECT count(*) FROM "+b.Schema+".log") == 0
	})

	st := p.Stats()
	if st.Forwarder.Messages != keys*perKey-1 || st.Forwarder.Rejected != 1 || st.Retention.Deleted == 0 || st.Sequencer.Sequenced == 0 {
		t.Errorf("Stats = %+v", st)
	}
}

// The log-based mode: with WAL set, the pipeline's relay appends what
// Publishers in ModeWAL committed, and its forwarder sends it.
func TestPipelineRelaysTheLogBasedMode(t *testing.T) {
	b := outboxtest.Setup(t)
	b.Register("orders", 2)
	ctx := outboxtest.Ctx(t)
	if err := relay.CreateSlot(ctx, b.Pool, b.Schema); err != nil {
		t.Fatal(err)
	}
	br := newBroker()
	p, err := pipeline.New(pipeline.Config{
		Schema: b.Schema, Pool: b.Pool,
		Forward:          forwarder.Config{Topics: []string{"orders"}, Target: br},
		WAL:              &relay.Config{},
		DisableSequencer: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	start(t, p)
	pub := b.Publisher(func(c *outbox.PublisherConfig) { c.Mode = outbox.ModeWAL })
	for i := range 10 {
		if err := pub.Publish("orders", outboxtest.Keyed("w-"+strconv.Itoa(i), "k", i+1, "ok")); err != nil {
			t.Fatal(err)
		}
	}
	outboxtest.WaitFor(t, "the WAL-mode messages at the broker", 30*time.Second, func() bool { return br.count("orders") == 10 })
	if st := p.Stats(); st.Relay.Appended != 10 {
		t.Errorf("Relay.Appended = %d, want 10", st.Relay.Appended)
	}
	t.Cleanup(func() { _ = relay.DropSlot(context.Background(), b.Pool, b.Schema, true) })
}

// A component that cannot start stops the pipeline: Run returns its error,
// naming it, and the other components are stopped (no goroutine left).
func TestPipelineStopsWhenAComponentCannotStart(t *testing.T) {
	b := outboxtest.Setup(t)
	b.Register("orders", 2)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	missing := forwarder.TargetFunc(func(context.Context, string, []*message.Message) (int, error) { return 0, nil })
	checker := topicRefuser{missing}
	p, err := pipeline.New(pipeline.Config{Schema: b.Schema, Pool: b.Pool, Forward: forwarder.Config{Topics: []string{"orders"}, Target: checker}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = p.Run(ctx)
	if !errors.Is(err, errNoSuchTopic) || !strings.Contains(err.Error(), "forwarder") {
		t.Fatalf("Run = %v, want the forwarder's %v", err, errNoSuchTopic)
	}
	if err := p.Run(ctx); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("a second Run = %v, want ErrClosed", err)
	}
}

var errNoSuchTopic = errors.New("no such topic")

// topicRefuser is a Target whose destinations do not exist.
type topicRefuser struct{ forwarder.TargetFunc }

func (topicRefuser) CheckTopic(context.Context, string, int) error { return errNoSuchTopic }

// Cancelling Run's context (SIGTERM) and Close both stop the pipeline
// cleanly: Run returns nil, and nothing is left running.
func TestPipelineStopsCleanly(t *testing.T) {
	for _, how := range []string{"context", "Close"} {
		t.Run(how, func(t *testing.T) {
			b := outboxtest.Setup(t)
			b.Register("orders", 2)
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			br := newBroker()
			p, err := pipeline.New(pipeline.Config{Schema: b.Schema, Pool: b.Pool, Forward: forwarder.Config{Topics: []string{"orders"}, Target: br}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx) }()
			b.PublishN("orders", 10, "s-")
			outboxtest.WaitFor(t, "the messages at the broker", 30*time.Second, func() bool { return br.count("orders") == 10 })
			if how == "context" {
				cancel()
			} else if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run = %v, want nil", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return")
			}
			_ = p.Close()
		})
	}
}

// Bad configurations are refused by New with a typed error naming the
// field by its path.
func TestPipelineConfigErrors(t *testing.T) {
	b := outboxtest.Setup(t)
	other := outboxtest.Setup(t)
	br := newBroker()
	for _, tc := range []struct {
		name  string
		cfg   pipeline.Config
		field string
	}{
		{"no pool", pipeline.Config{}, "Pool"},
		{"target without topics", pipeline.Config{Pool: b.Pool, Forward: forwarder.Config{Target: br}}, "Forward.Topics"},
		{"topics without target", pipeline.Config{Pool: b.Pool, Forward: forwarder.Config{Topics: []string{"orders"}}}, "Forward.Target"},
		{"another schema", pipeline.Config{Pool: b.Pool, Schema: b.Schema, Forward: forwarder.Config{Topics: []string{"orders"}, Target: br,
			Subscriber: outbox.SubscriberConfig{Schema: "elsewhere"}}}, "Forward.Subscriber.Schema"},
		{"another pool", pipeline.Config{Pool: b.Pool, Retention: retention.Config{Pool: other.Pool}}, "Retention.Pool"},
		{"bad retention", pipeline.Config{Pool: b.Pool, Retention: retention.Config{ChunkSize: -1}}, "Retention.ChunkSize"},
		{"bad relay", pipeline.Config{Pool: b.Pool, WAL: &relay.Config{MaxBatch: -1}}, "WAL.MaxBatch"},
		{"nothing to run", pipeline.Config{Pool: b.Pool, DisableSequencer: true, DisableRetention: true}, "Forward.Topics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pipeline.New(tc.cfg, nil)
			var ce *outboxtype.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, outbox.ErrInvalidConfig) || ce.Field != tc.field {
				t.Fatalf("New = %v, want a ConfigError on %s", err, tc.field)
			}
		})
	}
	var zero pipeline.Pipeline
	if err := zero.Run(context.Background()); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("a zero Pipeline's Run = %v", err)
	}
	if err := zero.Close(); err != nil {
		t.Fatalf("a zero Pipeline's Close = %v", err)
	}
}
