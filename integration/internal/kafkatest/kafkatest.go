// Package kafkatest gives the Kafka tests a cluster: franz-go's in-process
// kfake broker by default, or, when OUTBOX_TEST_KAFKA_BROKERS is set
// (host:9092[,host2:9092]), that real cluster. Every test creates its
// topics with names of its own (Topic: a unique suffix) through kadm and
// deletes them when it ends, so that runs never see each other's records.
//
// Faults that work on a real cluster too: a topic's max.message.bytes
// (Topic's configs) for records the broker refuses, and an Outage (local
// TCP proxies the test breaks and restores) for a broker that goes away.
// kfake's fault injection (Fake) is used only where nothing else can cause
// the fault; such a test is skipped against a real cluster, with the
// reason.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
)

// BrokersEnv names the environment variable that points the tests at a
// real cluster: comma-separated host:port seed brokers.
const BrokersEnv = "OUTBOX_TEST_KAFKA_BROKERS"

// Real reports whether the tests run against the cluster of BrokersEnv.
func Real() bool { return os.Getenv(BrokersEnv) != "" }

// Cluster is the Kafka cluster of one test.
type Cluster struct {
	// Brokers are the seed brokers.
	Brokers []string
	fake    *kfake.Cluster
	admin   *kadm.Client
}

// New returns the test's cluster: the real one of BrokersEnv, or a new
// single-broker kfake cluster (closed when the test ends) started with
// opts. kfake options other than the cluster's shape are fault injection:
// pass them through NewFake, which says why the test needs kfake.
func New(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	if env := os.Getenv(BrokersEnv); env != "" {
		c := &Cluster{Brokers: strings.Split(env, ",")}
		c.admin = newAdmin(t, c.Brokers)
		return c
	}
	fake, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	c := &Cluster{Brokers: fake.ListenAddrs(), fake: fake}
	c.admin = newAdmin(t, c.Brokers)
	return c
}

// NewFake returns a kfake cluster for a test that needs kfake's control
// (fault injection into requests a real broker answers only under
// conditions a test cannot bring about); why says what for. Against a real
// cluster (BrokersEnv set) the test is skipped with that reason.
func NewFake(t testing.TB, why string, opts ...kfake.Opt) (*Cluster, *kfake.Cluster) {
	t.Helper()
	if Real() {
		t.Skipf("needs the in-process kfake broker (%s is set): %s", BrokersEnv, why)
	}
	c := New(t, opts...)
	return c, c.fake
}

func newAdmin(t testing.TB, brokers []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// Admin is an admin client of the cluster (closed when the test ends).
func (c *Cluster) Admin() *kadm.Client { return c.admin }

// Compact runs log compaction now on kfake's topics with
// cleanup.policy=compact (kfake keeps the last record batch of a
// partition, as Kafka keeps the active segment) and reports true. A real
// cluster compacts on its own schedule: there it does nothing and reports
// false.
func (c *Cluster) Compact() bool {
	if c.fake == nil {
		return false
	}
	c.fake.Compact()
	return true
}

// Topic creates a topic named base plus a unique suffix with partitions
// partitions and the topic configs configs (e.g. "max.message.bytes"),
// deletes it when the test ends, and returns its name.
func (c *Cluster) Topic(t testing.TB, base string, partitions int, configs map[string]string) string {
	t.Helper()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := base + "-" + hex.EncodeToString(suffix)
	var cfg map[string]*string
	if len(configs) > 0 {
		cfg = map[string]*string{}
		for k, v := range configs {
			cfg[k] = kadm.StringPtr(v)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.admin.CreateTopic(ctx, int32(partitions), -1, cfg, name); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.admin.DeleteTopic(ctx, name); err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("delete topic %s: %v", name, err)
		}
	})
	// Wait until every partition has a leader (a real cluster creates
	// topics asynchronously).
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := c.admin.ListTopics(ctx, name)
		if err == nil {
			if d, ok := md[name]; ok && d.Err == nil && len(d.Partitions) == partitions {
				ready := true
				for _, p := range d.Partitions {
					if p.Leader < 0 || p.Err != nil {
						ready = false
					}
				}
				if ready {
					return name
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s has no leaders after 30 s: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ReadCommitted returns every committed record of topic (what a consumer
// with isolation level read_committed sees, as consumers of an
// exactly-once target must), partition by partition in offset order.
func (c *Cluster) ReadCommitted(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	return c.read(t, topic, true)
}

// ReadUncommitted returns every record of topic a read_uncommitted
// consumer sees: the records of aborted transactions too.
func (c *Cluster) ReadUncommitted(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	return c.read(t, topic, false)
}

func (c *Cluster) read(t testing.TB, topic string, committed bool) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	starts, err := c.admin.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		t.Fatalf("start offsets of %s: %v", topic, err)
	}
	var ends kadm.ListedOffsets
	if committed {
		ends, err = c.admin.ListCommittedOffsets(ctx, topic) // the last stable offsets
	} else {
		ends, err = c.admin.ListEndOffsets(ctx, topic)
	}
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	from := map[int32]kgo.Offset{}
	until := map[int32]int64{}
	var order []int32
	ends.Each(func(o kadm.ListedOffset) {
		s, _ := starts.Lookup(topic, o.Partition)
		if o.Offset > s.Offset {
			from[o.Partition] = kgo.NewOffset().At(s.Offset)
			until[o.Partition] = o.Offset
			order = append(order, o.Partition)
		}
	})
	if len(from) == 0 {
		return nil
	}
	read := &batchesRead{}
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.KeepControlRecords(), // a transaction's last offset is its marker: seeing it ends the read
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.WithHooks(read),
	}
	if committed {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	byPartition := map[int32][]*kgo.Record{}
	done := map[int32]bool{}
	batches, changed := int64(0), time.Now()
	for len(done) < len(from) {
		pctx, pcancel := context.WithTimeout(ctx, 250*time.Millisecond)
		fetches := cl.PollFetches(pctx)
		pcancel()
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v", topic, ctx.Err())
		}
		fetches.EachError(func(_ string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				t.Fatalf("reading %s/%d: %v", topic, p, err)
			}
		})
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Offset >= until[r.Partition] {
				done[r.Partition] = true
				return
			}
			if r.Offset == until[r.Partition]-1 {
				done[r.Partition] = true
			}
			if !r.Attrs.IsControl() {
				byPartition[r.Partition] = append(byPartition[r.Partition], r)
			}
		})
		// Read_committed, the records of aborted transactions are skipped
		// without a trace: once the broker served batches and serves no
		// more, only such records can be left below the end.
		if n := read.n.Load(); n != batches {
			batches, changed = n, time.Now()
		} else if batches > 0 && time.Since(changed) > 2*time.Second {
			break
		}
	}
	var out []*kgo.Record
	for _, p := range order {
		out = append(out, byPartition[p]...)
	}
	return out
}

// Header returns the value of header key of r ("" when it has none).
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Consume reads topic from the oldest offset with watermill-kafka's
// subscriber, read_committed, as a Watermill application would, into r,
// until the test ends. Every record's key must be its partition key.
func (c *Cluster) Consume(t *testing.T, topic string, r *fwdtest.Received) {
	t.Helper()
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               c.Brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ReconnectRetrySleep:   200 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			p, _ := kafka.MessagePartitionFromCtx(m.Context())
			key, _ := kafka.MessageKeyFromCtx(m.Context())
			if string(key) != m.Metadata.Get(outbox.PublishPartitionKeyMetadata) {
				t.Errorf("record key %q, partition key %q", key, m.Metadata.Get(outbox.PublishPartitionKeyMetadata))
			}
			r.Add(m, int(p))
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		<-done
	})
}

// batchesRead counts the record batches a consumer decoded, aborted ones
// included.
type batchesRead struct{ n atomic.Int64 }

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (b *batchesRead) OnFetchBatchRead(kgo.BrokerMetadata, string, int32, kgo.FetchBatchMetrics) {
	b.n.Add(1)
}
