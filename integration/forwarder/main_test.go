package forwarder_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newKafkaTarget returns a Kafka target on c's brokers, exactly once (the
// default) or at least once; it is closed when the test ends.
func newKafkaTarget(t testing.TB, c *kafkatest.Cluster, atLeastOnce bool) *kafka.Target {
	t.Helper()
	target, err := kafka.NewTarget(kafka.Config{
		Brokers: c.Brokers, AtLeastOnce: atLeastOnce,
		ClientOptions: []kgo.Opt{kgo.DialTimeout(time.Second)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := target.Close(); err != nil {
			t.Errorf("kafka.Target.Close: %v", err)
		}
	})
	return target
}

// to forwards every outbox topic to the Kafka topic kafkaTopic (a topic of
// the test's own, see kafkatest.Cluster.Topic), then applies tune.
func to(kafkaTopic string, tune func(*forwarder.Config)) func(*forwarder.Config) {
	return func(c *forwarder.Config) {
		c.TargetTopic = func(string) string { return kafkaTopic }
		if tune != nil {
			tune(c)
		}
	}
}
