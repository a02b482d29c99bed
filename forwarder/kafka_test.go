package forwarder_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/partitioning"
)

func newKafka(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newKafkaTarget(t *testing.T, brokers []string, tune func(*sarama.Config)) *forwarder.KafkaTarget {
	t.Helper()
	return newKafkaTargetMode(t, brokers, false, tune)
}

// newKafkaTargetMode returns a KafkaTarget, exactly-once (the default) or
// at-least-once.
func newKafkaTargetMode(t *testing.T, brokers []string, atLeastOnce bool, tune func(*sarama.Config)) *forwarder.KafkaTarget {
	t.Helper()
	sc := forwarder.DefaultSaramaConfig()
	sc.Net.DialTimeout = time.Second
	sc.Net.ReadTimeout = 2 * time.Second
	sc.Net.WriteTimeout = 2 * time.Second
	if tune != nil {
		tune(sc)
	}
	target, err := forwarder.NewKafkaTarget(forwarder.KafkaConfig{Brokers: brokers, Sarama: sc, AtLeastOnce: atLeastOnce})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	return target
}

// consumeKafka reads topic from the oldest offset with watermill-kafka's
// subscriber, as any Watermill application would, until the test ends.
func consumeKafka(t *testing.T, brokers []string, topic string, r *received) {
	t.Helper()
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
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
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			p, _ := kafka.MessagePartitionFromCtx(m.Context())
			key, _ := kafka.MessageKeyFromCtx(m.Context())
			if string(key) != m.Metadata.Get(outbox.PartitionKeyMetadata) {
				t.Errorf("record key %q, partition key %q", key, m.Metadata.Get(outbox.PartitionKeyMetadata))
			}
			r.add(m, int(p))
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		<-done
	})
}

func TestMurmur2PartitionerPlacesKeysLikeTheOutbox(t *testing.T) {
	p := forwarder.NewMurmur2Partitioner("t")
	if !p.RequiresConsistency() {
		t.Fatal("a key partitioner must require consistency")
	}
	for _, n := range []int{1, 2, 3, 7, 16, 100, 1024} {
		for i := 0; i < 2000; i++ {
			key := "key-" + strconv.Itoa(i*7919)
			want, err := partitioning.Default().Partition(key, n)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, int32(n))
			if err != nil {
				t.Fatal(err)
			}
			if int(got) != want {
				t.Fatalf("key %q, %d partitions: kafka partition %d, outbox partition %d", key, n, got, want)
			}
		}
	}
	// Kafka's own reference values (Java client, murmur2): "foobar" is
	// partition 14 of 16 (see package partitioning).
	got, _ := p.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder("foobar")}, 16)
	if got != 14 {
		t.Fatalf("foobar -> %d, want 14", got)
	}
}

func TestKafkaConfigRejectsFNVAndBadSettings(t *testing.T) {
	fnv := sarama.NewConfig()
	fnv.Producer.Return.Successes = true
	_, err := forwarder.NewKafkaTarget(forwarder.KafkaConfig{Brokers: []string{"x:9092"}, Sarama: fnv})
	if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "Partitioner") {
		t.Fatalf("sarama's FNV partitioner: %v", err)
	}
	noAcks := forwarder.DefaultSaramaConfig()
	noAcks.Producer.RequiredAcks = sarama.NoResponse
	if _, err := forwarder.NewKafkaTarget(forwarder.KafkaConfig{Brokers: []string{"x:9092"}, Sarama: noAcks}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("acks=0: %v", err)
	}
	old := forwarder.DefaultSaramaConfig()
	old.Version = sarama.V0_10_2_0
	if _, err := forwarder.NewKafkaTarget(forwarder.KafkaConfig{Brokers: []string{"x:9092"}, Sarama: old}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("Kafka 0.10: %v", err)
	}
	if _, err := forwarder.NewKafkaTarget(forwarder.KafkaConfig{}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("no brokers: %v", err)
	}
	// Kafka transactions need acks from all in-sync replicas; at least
	// once, the leader's ack will do.
	leaderAck := forwarder.DefaultSaramaConfig()
	leaderAck.Producer.RequiredAcks = sarama.WaitForLocal
	_, err = forwarder.NewKafkaTarget(forwarder.KafkaConfig{Brokers: []string{"x:9092"}, Sarama: leaderAck})
	var cerr *outbox.ConfigError
	if !errors.As(err, &cerr) || cerr.Field != "Sarama.Producer.RequiredAcks" || !strings.Contains(err.Error(), "AtLeastOnce") {
		t.Fatalf("exactly once with acks=1: %v", err)
	}
	if _, err := forwarder.NewKafkaTarget(forwarder.KafkaConfig{Brokers: []string{"x:9092"}, Sarama: leaderAck, AtLeastOnce: true}); err != nil {
		t.Fatalf("at least once with acks=1: %v", err)
	}
	if _, err := forwarder.NewKafkaTarget(forwarder.KafkaConfig{Brokers: []string{"x:9092"}, TransactionTimeout: time.Millisecond}); !errors.As(err, &cerr) || cerr.Field != "TransactionTimeout" {
		t.Fatalf("a 1 ms transaction timeout: %v", err)
	}
	// Unreachable brokers are fine at construction: the target connects on
	// the first send.
	if _, err := forwarder.NewKafkaTarget(forwarder.KafkaConfig{Brokers: []string{"127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
}

// Two forwarder instances share 16 outbox partitions and forward to a
// 16-partition Kafka topic; a watermill-kafka subscriber reads it.
func TestKafkaEveryMessageArrivesInKeyOrderOnTheSamePartitionNumber(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 16)
	cluster := newKafka(t, kfake.SeedTopics(16, "orders.kafka"))
	brokers := cluster.ListenAddrs()

	mapping := func(cfg *forwarder.Config) {
		cfg.TargetTopic = func(topic string) string { return topic + ".kafka" }
	}
	a := startForwarder(t, e, nil, newKafkaTarget(t, brokers, nil), []string{"orders"}, mapping)
	// The second instance compresses its record batches.
	b := startForwarder(t, e, nil, newKafkaTarget(t, brokers, func(c *sarama.Config) { c.Producer.Compression = sarama.CompressionZSTD }), []string{"orders"}, mapping)
	time.Sleep(2 * time.Second) // both instances hold leases

	pub := newPublisher(t, e)
	for i := 0; i < 20; i++ {
		pub.round("orders", 40, func(m *message.Message) {
			if strings.HasSuffix(m.Metadata.Get(outbox.PartitionKeyMetadata), "-7") {
				m.Metadata.Set("note", "key seven") // arbitrary metadata travels as headers
			}
		})
	}

	r := &received{}
	consumeKafka(t, brokers, "orders.kafka", r)
	outboxtest.WaitFor(t, "every message on Kafka", time.Minute, func() bool { return r.distinct() == pub.count() })
	dups := r.check(t, pub.snapshot(), nil)
	t.Logf("%d messages, %d duplicates; forwarder stats %+v / %+v", pub.count(), dups, a.Stats(), b.Stats())
	if a.Stats().Messages == 0 || b.Stats().Messages == 0 {
		t.Errorf("the instances did not share the work: %+v / %+v", a.Stats(), b.Stats())
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.msgs {
		if g.brokerPartition != g.outboxPartition {
			t.Fatalf("key %s: Kafka partition %d, outbox partition %d", g.key, g.brokerPartition, g.outboxPartition)
		}
		if g.metadata.Get(outbox.MetadataAttempt) != "" {
			t.Fatalf("%s leaked to Kafka", outbox.MetadataAttempt)
		}
		want := outbox.StableID("orders", g.outboxPartition, mustAtoi(t, g.metadata.Get(outbox.MetadataSeq)))
		if g.id != want {
			t.Fatalf("header %s = %q, want %q", outbox.MetadataID, g.id, want)
		}
		if g.metadata.Get(outbox.MetadataPartitionKey) != g.key {
			t.Fatalf("header %s = %q, want %q", outbox.MetadataPartitionKey, g.metadata.Get(outbox.MetadataPartitionKey), g.key)
		}
		if strings.HasSuffix(g.key, "-7") != (g.metadata.Get("note") == "key seven") {
			t.Fatalf("metadata lost: %v", g.metadata)
		}
	}
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The Kafka cluster goes away in the middle of the stream and comes back
// (same port, same data) seconds later; meanwhile more messages are
// committed. The forwarder waits and resumes; nothing is lost, per-key
// order holds, duplicates are copies of messages that arrived before.
func TestKafkaBrokerDownAndBackMidStream(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 4)
	port, dir := freePort(t), t.TempDir()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(dir), kfake.SeedTopics(4, "orders")}
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	brokers := cluster.ListenAddrs()
	fwd := startForwarder(t, e, nil, newKafkaTarget(t, brokers, nil), []string{"orders"}, nil)

	pub := newPublisher(t, e)
	stop := make(chan struct{})
	publishing := make(chan struct{})
	go func() {
		defer close(publishing)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				pub.round("orders", 12, nil)
			}
		}
	}()
	outboxtest.WaitFor(t, "a part of the stream forwarded", time.Minute, func() bool { return fwd.Stats().Messages > 300 })
	cluster.Close()
	outboxtest.WaitFor(t, "failed sends while Kafka is down", time.Minute, func() bool { return fwd.Stats().Failures > 3 })
	time.Sleep(3 * time.Second)
	before := fwd.Stats()
	cluster, err = kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	time.Sleep(time.Second)
	close(stop)
	<-publishing
	t.Logf("published %d; forwarded %d before the restart, %d failed sends (%s)", pub.count(), before.Messages, before.Failures, before.LastError)

	r := &received{}
	consumeKafka(t, cluster.ListenAddrs(), "orders", r)
	outboxtest.WaitFor(t, "every message on Kafka", 2*time.Minute, func() bool { return r.distinct() == pub.count() })
	dups := r.check(t, pub.snapshot(), nil)
	t.Logf("%d messages arrived, %d duplicates; stats %+v", r.total(), dups, fwd.Stats())
}

// Produce requests fail now and then for one of the partitions they carry
// (8 outbox partitions onto 3 Kafka partitions, so a batch spans several):
// the forwarder retries the rest of each batch, loses nothing and keeps
// per-key order. At least once, records of other partitions that were
// stored are sent again, as duplicates of messages that arrived before;
// exactly once, the failed batch's transaction is aborted, so nothing of
// it is seen twice. With 8 outbox partitions onto 3, this is also the
// unequal-count case of exactly-once delivery.
func TestKafkaTransientProduceErrors(t *testing.T) {
	for _, mode := range []struct {
		name        string
		atLeastOnce bool
	}{{"exactly-once", false}, {"at-least-once", true}} {
		t.Run(mode.name, func(t *testing.T) { testKafkaTransientProduceErrors(t, mode.atLeastOnce) })
	}
}

func testKafkaTransientProduceErrors(t *testing.T, atLeastOnce bool) {
	e := newEnv(t)
	e.Register("orders", 8)
	cluster := newKafka(t, kfake.SeedTopics(3, "orders"))
	// Every third produce request that carries several partitions fails
	// for partition 1; its other partitions are stored.
	var produces, failed atomic.Int64
	decided := map[kmsg.Request]bool{} // used on the cluster goroutine only
	cluster.Fault(kfake.Fault{
		Keys:       []kmsg.Key{kmsg.Produce},
		Topic:      "orders",
		Partitions: []int32{1},
		Err:        kerr.NotEnoughReplicas,
		Count:      -1,
		When: func(req kmsg.Request) bool {
			fail, seen := decided[req]
			if !seen {
				pr := req.(*kmsg.ProduceRequest)
				fail = produces.Add(1)%3 == 0 && len(pr.Topics) == 1 && len(pr.Topics[0].Partitions) > 1
				if fail {
					failed.Add(1)
				}
				decided[req] = fail
			}
			return fail
		},
	})
	brokers := cluster.ListenAddrs()
	fwd := startForwarder(t, e, nil, newKafkaTargetMode(t, brokers, atLeastOnce, nil), []string{"orders"}, nil)
	pub := newPublisher(t, e)
	for i := 0; i < 30; i++ {
		pub.round("orders", 24, nil)
	}
	r := &received{}
	consumeKafka(t, brokers, "orders", r)
	outboxtest.WaitFor(t, "every message on Kafka", time.Minute, func() bool { return r.distinct() == pub.count() })
	time.Sleep(500 * time.Millisecond) // copies, if any, arrive with the rest
	dups := r.check(t, pub.snapshot(), nil)
	st := fwd.Stats()
	t.Logf("%d messages, %d duplicates, %d produce requests, %d failed in part; stats %+v", pub.count(), dups, produces.Load(), failed.Load(), st)
	switch {
	case st.Failures == 0 || failed.Load() == 0:
		t.Fatal("no send failed in part: the fault injection did not work")
	case atLeastOnce && dups == 0:
		t.Fatal("no duplicates at least once: the partitions stored before the failure were not sent again")
	case !atLeastOnce && dups != 0:
		t.Fatalf("%d duplicates exactly once: a failed transaction's records were seen, or sent again after a commit", dups)
	}
}

// Instance A dies in the middle of a batch: half of it reached Kafka, the
// cursor did not move, A's leases stop being renewed. B takes A's
// partitions over and sends the batch again: the copies carry ids that
// arrived before, and per-key order holds.
// An instance dies after sending half a batch, before its cursor moved:
// the next owner gets the whole batch again. At least once, it sends the
// half again (copies with the same outbox_id); exactly once (the
// default), it reads the half back from Kafka and skips it.
func TestKafkaInstanceKilledMidBatch(t *testing.T) {
	for _, mode := range []struct {
		name        string
		atLeastOnce bool
	}{{"exactly-once", false}, {"at-least-once", true}} {
		t.Run(mode.name, func(t *testing.T) {
			e := newEnv(t)
			e.Register("orders", 8)
			cluster := newKafka(t, kfake.SeedTopics(8, "orders"))
			brokers := cluster.ListenAddrs()

			pub := newPublisher(t, e)
			for i := 0; i < 40; i++ {
				pub.round("orders", 16, nil)
			}
			poolA, freezeA, thawA := pgtest.FreezablePool(t)
			crashing := newCrashingTarget(newKafkaTargetMode(t, brokers, mode.atLeastOnce, nil), 100, freezeA)
			startForwarder(t, e, poolA, crashing, []string{"orders"}, nil)
			<-crashing.crashed
			t.Cleanup(func() { thawA(); close(crashing.release) }) // runs before A's Close

			b := startForwarder(t, e, nil, newKafkaTargetMode(t, brokers, mode.atLeastOnce, nil), []string{"orders"}, nil)
			r := &received{}
			consumeKafka(t, brokers, "orders", r)
			outboxtest.WaitFor(t, "every message on Kafka", time.Minute, func() bool { return r.distinct() == pub.count() })
			time.Sleep(500 * time.Millisecond) // copies, if any, arrive with the rest
			dups := r.check(t, pub.snapshot(), nil)
			t.Logf("A sent %d messages and half a batch (%d) before dying; %d duplicates; B %+v", crashing.sent.Load(), crashing.halfLen.Load(), dups, b.Stats())
			if crashing.halfLen.Load() == 0 {
				t.Fatal("A did not send half a batch")
			}
			switch {
			case mode.atLeastOnce && dups < int(crashing.halfLen.Load()):
				t.Fatalf("%d duplicates: the half batch A sent was not sent again by B", dups)
			case !mode.atLeastOnce && dups != 0:
				t.Fatalf("%d duplicates: B sent again what A had committed to Kafka", dups)
			}
		})
	}
}

// Poison: a message larger than the broker's max message bytes and one
// that watermill-kafka's marshaler refuses go to the dead-letter table; the
// stream continues around them, in order.
func TestKafkaPoisonMessagesAreDeadLettered(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 4)
	const maxBytes = 64 << 10
	cluster := newKafka(t, kfake.SeedTopics(4, "orders"), kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(maxBytes)}))
	brokers := cluster.ListenAddrs()

	pub := newPublisher(t, e)
	var big, reserved []string
	for i := 0; i < 20; i++ {
		pub.round("orders", 10, func(m *message.Message) {
			switch m.Metadata.Get("n") + "/" + m.Metadata.Get(outbox.PartitionKeyMetadata) {
			case "5/key-3", "12/key-8":
				m.Payload = make([]byte, 100<<10) // larger than the broker accepts
				big = append(big, m.UUID)
			case "9/key-1":
				m.Metadata.Set(kafka.UUIDHeaderKey, "x") // reserved by watermill-kafka
				reserved = append(reserved, m.UUID)
			}
		})
	}
	// sarama's own limit is above the broker's: the broker refuses them.
	startForwarder(t, e, nil, newKafkaTarget(t, brokers, nil), []string{"orders"}, nil)
	r := &received{}
	consumeKafka(t, brokers, "orders", r)
	want := len(big) + len(reserved)
	outboxtest.WaitFor(t, "every message forwarded or dead-lettered", time.Minute, func() bool {
		return r.distinct() == pub.count()-want && len(e.deadLettered(t)) == want
	})
	dead := e.deadLettered(t)
	for _, u := range big {
		if !strings.Contains(dead[u], "too large") {
			t.Fatalf("big message %s: dead-letter reason %q", u, dead[u])
		}
	}
	for _, u := range reserved {
		if !strings.Contains(dead[u], "reserved") {
			t.Fatalf("message with reserved metadata %s: dead-letter reason %q", u, dead[u])
		}
	}
	r.check(t, pub.snapshot(), dead)
	time.Sleep(500 * time.Millisecond) // nothing else arrives late
	if n := r.distinct(); n != pub.count()-want {
		t.Fatalf("%d distinct messages arrived, want %d", n, pub.count()-want)
	}
}

// Sarama's client-side limit (Producer.MaxMessageBytes) rejects a record
// before it is sent: the message is dead-lettered at once.
func TestKafkaRecordOverProducerLimitIsDeadLettered(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 2)
	cluster := newKafka(t, kfake.SeedTopics(2, "orders"))
	brokers := cluster.ListenAddrs()
	pub := newPublisher(t, e)
	var big string
	for i := 0; i < 5; i++ {
		pub.round("orders", 4, func(m *message.Message) {
			if m.Metadata.Get("n") == "3" && m.Metadata.Get(outbox.PartitionKeyMetadata) == "key-2" {
				m.Payload = make([]byte, 20<<10)
				big = m.UUID
			}
		})
	}
	startForwarder(t, e, nil, newKafkaTarget(t, brokers, func(c *sarama.Config) { c.Producer.MaxMessageBytes = 16 << 10 }), []string{"orders"}, nil)
	r := &received{}
	consumeKafka(t, brokers, "orders", r)
	outboxtest.WaitFor(t, "every message forwarded or dead-lettered", time.Minute, func() bool {
		return r.distinct() == pub.count()-1 && len(e.deadLettered(t)) == 1
	})
	dead := e.deadLettered(t)
	if !strings.Contains(dead[big], "MaxMessageBytes") {
		t.Fatalf("dead letters %v, want %s for MaxMessageBytes", dead, big)
	}
	r.check(t, pub.snapshot(), dead)
}
