package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// conformancePool is a larger pool: the suite runs many pub/subs in parallel.
func conformancePool(t *testing.T) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 120
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// conformanceTuning keeps the default profile's shape with a short retry
// backoff: the suite nacks hundreds of times in a row and expects prompt
// redelivery, where production settings would (rightly) back off to a minute.
func conformanceTuning() adaptive.Tuning {
	tu := adaptive.Default()
	tu.BackoffBase = 2 * time.Millisecond
	tu.BackoffMax = 10 * time.Millisecond
	tu.LeaseTTL = 5 * time.Second
	return tu
}

func conformanceConstructors(t *testing.T, strategy outbox.Strategy) (tests.PubSubConstructor, tests.ConsumerGroupPubSubConstructor) {
	pool := conformancePool(t)
	schema := pgtest.Schema(t)
	if err := outbox.Migrate(context.Background(), pool, schema); err != nil {
		t.Fatal(err)
	}
	logger := watermill.NopLogger{}
	// One sequencer serves every pub/sub of the suite, as one per instance
	// would in production; the subscribers do not start their own.
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: pool}, logger)
	if err != nil {
		t.Fatal(err)
	}
	go seq.Run(context.Background())
	t.Cleanup(func() { _ = seq.Close() })
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := outbox.NewPublisher(outbox.PublisherConfig{
			Schema: schema, DB: pool, OwnTransaction: true,
		}, logger)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
			Schema: schema, Pool: pool, ConsumerGroup: group, Strategy: strategy,
			Tuning: conformanceTuning(), CloseTimeout: time.Second, DisableSequencer: true,
		}, logger)
		if err != nil {
			t.Fatal(err)
		}
		register := func(topic string) error { return outbox.RegisterTopic(context.Background(), pool, schema, topic, 1) }
		return registeringPublisher{pub, register}, registeringSubscriber{sub, register}
	}
	// Without an explicit group every subscriber sees every message, as with
	// Kafka: each gets a group of its own, which starts at the oldest message.
	plain := func(t *testing.T) (message.Publisher, message.Subscriber) {
		return withGroup(t, "solo-"+watermill.NewShortUUID())
	}
	return plain, withGroup
}

// The suite names its topics as it goes; an application registers its own
// before use (RegisterTopic). These wrappers register each topic, with one
// partition, before its first publish or subscribe.
type registeringPublisher struct {
	message.Publisher
	register func(topic string) error
}

func (p registeringPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.register(topic); err != nil {
		return err
	}
	return p.Publisher.Publish(topic, msgs...)
}

type registeringSubscriber struct {
	*outbox.Subscriber
	register func(topic string) error
}

func (s registeringSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.register(topic); err != nil {
		return nil, err
	}
	return s.Subscriber.Subscribe(ctx, topic)
}

func (s registeringSubscriber) SubscribeInitialize(topic string) error {
	if err := s.register(topic); err != nil {
		return err
	}
	return s.Subscriber.SubscribeInitialize(topic)
}

var conformanceFeatures = tests.Features{
	ConsumerGroups:                   true,
	ExactlyOnceDelivery:              false,
	GuaranteedOrder:                  true, // topics are registered with one partition
	Persistent:                       true,
	NewSubscriberReceivesOldMessages: true,
}

func TestWatermillConformanceLeased(t *testing.T) {
	t.Parallel()
	plain, grouped := conformanceConstructors(t, outbox.Leased)
	tests.TestPubSub(t, conformanceFeatures, plain, grouped)
}

func TestWatermillConformanceTransactional(t *testing.T) {
	t.Parallel()
	plain, grouped := conformanceConstructors(t, outbox.Transactional)
	tests.TestPubSub(t, conformanceFeatures, plain, grouped)
}

func TestWatermillStress(t *testing.T) {
	if testing.Short() {
		t.Skip("stress suite skipped in -short mode")
	}
	// Several full suites in parallel, each at the suite's short sizes: what
	// a 2-core CI can afford next to the full-size runs above.
	t.Setenv("STRESS_TEST_COUNT", "3")
	features := conformanceFeatures
	features.ForceShort = true
	plain, grouped := conformanceConstructors(t, outbox.Leased)
	tests.TestPubSubStressTest(t, features, plain, grouped)
}
