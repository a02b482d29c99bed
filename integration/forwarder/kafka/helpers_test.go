package kafka_test

import (
	"context"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/millrace/watermill-outbox/internal/consumer"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// deliveryModes are the Kafka target's two delivery modes, for the tests
// that run in both.
var deliveryModes = []struct {
	name        string
	atLeastOnce bool
}{{"exactly-once", false}, {"at-least-once", true}}

// newTarget returns a Target on c's brokers, exactly once or at least
// once, with extra client options; it is closed when the test ends.
func newTarget(t *testing.T, c *kafkatest.Cluster, atLeastOnce bool, opts ...kgo.Opt) *kafka.Target {
	t.Helper()
	return newTargetWith(t, kafka.Config{Brokers: c.Brokers, AtLeastOnce: atLeastOnce, ClientOptions: opts})
}

func newTargetWith(t *testing.T, cfg kafka.Config) *kafka.Target {
	t.Helper()
	cfg.ClientOptions = append([]kgo.Opt{kgo.DialTimeout(time.Second)}, cfg.ClientOptions...)
	target, err := kafka.NewTarget(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := target.Close(); err != nil {
			t.Errorf("Target.Close: %v", err)
		}
	})
	return target
}

// kafkaRecord is a record read back from Kafka.
type kafkaRecord struct {
	partition int32
	i         int // metadata "i": the position in the test's batch
	id        string
}

// kafkaLog reads every committed record of topic (read_committed, as
// consumers of an exactly-once target must), partition by partition in
// offset order.
func kafkaLog(t *testing.T, c *kafkatest.Cluster, topic string) []kafkaRecord {
	t.Helper()
	return records(c.ReadCommitted(t, topic))
}

func records(rs []*kgo.Record) []kafkaRecord {
	out := make([]kafkaRecord, 0, len(rs))
	for _, r := range rs {
		kr := kafkaRecord{partition: r.Partition, id: kafkatest.Header(r, "outbox_id")}
		kr.i = atoi(kafkatest.Header(r, "i"))
		out = append(out, kr)
	}
	return out
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// positions returns the batch positions of records, in log order.
func positions(records []kafkaRecord) []int {
	out := make([]int, len(records))
	for i, r := range records {
		out[i] = r.i
	}
	return out
}

// writerRecord is a partition's writer record shared by the targets of a
// test, as the cursor row is shared by a group's forwarders
// (consumer.WriterRecord).
type writerRecord struct {
	mu     sync.Mutex
	writer string
}

func (r *writerRecord) Writer(context.Context) (string, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writer, true, nil
}

func (r *writerRecord) SetWriter(_ context.Context, writer string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writer = writer
	return nil
}

// underLease marks batch as delivered under the lease with token and the
// partition's writer record rec, as a Worker marks its deliveries.
func underLease(batch []*message.Message, token int64, rec consumer.WriterRecord) []*message.Message {
	for _, m := range batch {
		m.SetContext(consumer.Delivered(m.Context(), token, rec))
	}
	return batch
}
