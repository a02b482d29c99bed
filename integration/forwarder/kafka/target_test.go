package kafka_test

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/partitioning"
)

// With equal partition counts a key lands on the same partition number in
// Kafka as in the outbox: the target's partitioner is murmur2 like Kafka's
// Java client and the outbox (and kgo's StickyKeyPartitioner(nil)).
// Keyless records go to their outbox partition number modulo the count.
func TestPartitionerPlacesKeysLikeTheOutbox(t *testing.T) {
	p := kafka.Partitioner().ForTopic("t")
	kgoKafka := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	for _, n := range []int{1, 2, 3, 7, 16, 100, 1024} {
		for i := 0; i < 2000; i++ {
			key := "key-" + strconv.Itoa(i*7919)
			want, err := partitioning.Default().Partition(key, n)
			if err != nil {
				t.Fatal(err)
			}
			r := &kgo.Record{Key: []byte(key)}
			if !p.RequiresConsistency(r) {
				t.Fatal("a key partitioner must require consistency")
			}
			if got := p.Partition(r, n); got != want {
				t.Fatalf("key %q, %d partitions: kafka partition %d, outbox partition %d", key, n, got, want)
			}
			if got := kgoKafka.Partition(r, n); got != want {
				t.Fatalf("key %q, %d partitions: kgo's Kafka partitioner %d, outbox partition %d", key, n, got, want)
			}
		}
	}
	// Kafka's own reference values (Java client, murmur2): "foobar" is
	// partition 14 of 16 (see package partitioning).
	if got := p.Partition(&kgo.Record{Key: []byte("foobar")}, 16); got != 14 {
		t.Fatalf("foobar -> %d, want 14", got)
	}
	// Keyless: the outbox partition (header outbox_partition) modulo n.
	for _, c := range []struct{ outboxPartition, n, want int }{{5, 8, 5}, {13, 8, 5}, {0, 3, 0}, {7, 3, 1}} {
		r := &kgo.Record{Headers: []kgo.RecordHeader{{Key: outbox.MetadataPartition, Value: []byte(strconv.Itoa(c.outboxPartition))}}}
		if got := p.Partition(r, c.n); got != c.want {
			t.Fatalf("keyless record of outbox partition %d, %d partitions: %d, want %d", c.outboxPartition, c.n, got, c.want)
		}
	}
}

func TestConfigRefusesBadSettings(t *testing.T) {
	var cerr *outboxtype.ConfigError
	for _, c := range []struct {
		name  string
		cfg   kafka.Config
		field string
	}{
		{"no brokers", kafka.Config{}, "Brokers"},
		{"an empty broker", kafka.Config{Brokers: []string{""}}, "Brokers"},
		{"a 1 ms transaction timeout", kafka.Config{Brokers: []string{"x:9092"}, TransactionTimeout: time.Millisecond}, "TransactionTimeout"},
		{"a negative tail scan limit", kafka.Config{Brokers: []string{"x:9092"}, TailScanLimit: -1}, "TailScanLimit"},
		{"a 100-byte batch", kafka.Config{Brokers: []string{"x:9092"}, MaxBatchBytes: 100}, "MaxBatchBytes"},
		{"a negative idle timeout", kafka.Config{Brokers: []string{"x:9092"}, ProducerIdleTimeout: -time.Second}, "ProducerIdleTimeout"},
		{"a nil client option", kafka.Config{Brokers: []string{"x:9092"}, ClientOptions: []kgo.Opt{nil}}, "ClientOptions"},
		// kgo refuses idempotent writes without acks from all in-sync
		// replicas: at least once, the client options say so.
		{"acks=1 with idempotence", kafka.Config{Brokers: []string{"x:9092"}, AtLeastOnce: true, ClientOptions: []kgo.Opt{kgo.RequiredAcks(kgo.LeaderAck())}}, "ClientOptions"},
		// Transactions cannot go without idempotence.
		{"exactly once without idempotence", kafka.Config{Brokers: []string{"x:9092"}, ClientOptions: []kgo.Opt{kgo.DisableIdempotentWrite()}}, "ClientOptions"},
	} {
		_, err := kafka.NewTarget(c.cfg, nil)
		if !errors.As(err, &cerr) || cerr.Field != c.field || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Fatalf("%s: %v, want a ConfigError on %s", c.name, err, c.field)
		}
	}
	// At least once, the leader's ack will do (without idempotence).
	if _, err := kafka.NewTarget(kafka.Config{Brokers: []string{"x:9092"}, AtLeastOnce: true,
		ClientOptions: []kgo.Opt{kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()}}, nil); err != nil {
		t.Fatalf("at least once with acks=1: %v", err)
	}
	// Unreachable brokers are fine at construction: the target connects on
	// the first send.
	target, err := kafka.NewTarget(kafka.Config{Brokers: []string{"127.0.0.1:1"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := target.Close(); err != nil {
		t.Fatal(err)
	}
}

// Exactly once, the target refuses the Subscriber's key isolation (a held
// message would be sent after newer ones, and the next owner's tail read
// would skip it); at least once it forwards with it.
func TestNewForwarderRefusesKeyIsolationWithExactlyOnce(t *testing.T) {
	e := fwdtest.NewEnv(t)
	c := kafkatest.New(t)
	for _, atLeastOnce := range []bool{false, true} {
		_, err := forwarder.NewForwarder(forwarder.Config{
			Subscriber: outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, KeyIsolation: outbox.KeyIsolation{Enabled: true}},
			Topics:     []string{"orders"},
			Target:     newTarget(t, c, atLeastOnce),
		}, nil)
		var ce *outboxtype.ConfigError
		switch {
		case !atLeastOnce && (!errors.As(err, &ce) || ce.Field != "Subscriber.KeyIsolation"):
			t.Fatalf("isolation with exactly-once delivery: %v, want a ConfigError on Subscriber.KeyIsolation", err)
		case atLeastOnce && err != nil:
			t.Fatalf("isolation at least once: %v", err)
		}
	}
}

// A record of DefaultMarshaler is what watermill-kafka's publisher writes:
// its Subscriber (DefaultMarshaler as Unmarshaler) reads the message with
// its UUID, payload and metadata unchanged, and the record key is the
// partition key. Metadata named _watermill_message_uuid is refused, as
// watermill-kafka refuses it.
func TestWatermillKafkaSubscriberReadsTheRecords(t *testing.T) {
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 1, nil)
	target := newTarget(t, c, true)
	batch := fwdtest.OutboxBatch(5, func(i int) string { return "key-" + strconv.Itoa(i) })
	for _, m := range batch {
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, m.Metadata.Get(outbox.MetadataPartitionKey))
	}
	batch[2].Metadata.Set("note", "with metadata")
	batch[3].Payload = nil
	if done, err := target.Send(outboxtest.Ctx(t), topic, batch); done != len(batch) || err != nil {
		t.Fatalf("Send: done %d of %d, %v", done, len(batch), err)
	}
	r := &fwdtest.Received{}
	c.Consume(t, topic, r) // checks key = partition key
	outboxtest.WaitFor(t, "the batch read back", time.Minute, func() bool { return r.Distinct() == len(batch) })
	got := r.Messages()
	for i, m := range batch {
		g := got[i]
		want := forwarder.Outgoing(m)
		if g.UUID != m.UUID {
			t.Fatalf("message %d: UUID %s, want %s", i, g.UUID, m.UUID)
		}
		if len(g.Metadata) != len(want.Metadata) {
			t.Fatalf("message %d: metadata %v, want %v", i, g.Metadata, want.Metadata)
		}
		for k, v := range want.Metadata {
			if g.Metadata.Get(k) != v {
				t.Fatalf("message %d: metadata %s = %q, want %q", i, k, g.Metadata.Get(k), v)
			}
		}
	}
	// The payload travels as the record value (read back with kgo).
	for _, rec := range c.ReadCommitted(t, topic) {
		i := atoi(kafkatest.Header(rec, "i"))
		if string(rec.Value) != string(batch[i].Payload) {
			t.Fatalf("record %d: value %q, want %q", i, rec.Value, batch[i].Payload)
		}
	}

	reserved := message.NewMessage(watermill.NewUUID(), []byte("x"))
	reserved.Metadata.Set(wmkafka.UUIDHeaderKey, "y")
	if _, err := (kafka.DefaultMarshaler{}).Marshal(topic, reserved); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("metadata %s: %v, want it refused as reserved", wmkafka.UUIDHeaderKey, err)
	}
	if _, err := (wmkafka.DefaultMarshaler{}).Marshal(topic, reserved); err == nil {
		t.Fatal("watermill-kafka accepts what DefaultMarshaler refuses")
	}
}

// Two forwarder instances share 16 outbox partitions and forward to a
// 16-partition Kafka topic; a watermill-kafka subscriber reads it.
func TestEveryMessageArrivesInKeyOrderOnTheSamePartitionNumber(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 16)
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders.kafka", 16, nil)

	mapping := func(cfg *forwarder.Config) {
		cfg.TargetTopic = func(string) string { return topic }
	}
	a := fwdtest.StartForwarder(t, e, nil, newTarget(t, c, false), []string{"orders"}, mapping)
	// The second instance compresses its record batches.
	b := fwdtest.StartForwarder(t, e, nil, newTarget(t, c, false, kgo.ProducerBatchCompression(kgo.ZstdCompression())), []string{"orders"}, mapping)
	time.Sleep(2 * time.Second) // both instances hold leases

	pub := fwdtest.NewPublisher(t, e)
	for i := 0; i < 20; i++ {
		pub.Round("orders", 40, func(m *message.Message) {
			if strings.HasSuffix(m.Metadata.Get(outbox.PublishPartitionKeyMetadata), "-7") {
				m.Metadata.Set("note", "key seven") // arbitrary metadata travels as headers
			}
		})
	}

	r := &fwdtest.Received{}
	c.Consume(t, topic, r)
	outboxtest.WaitFor(t, "every message on Kafka", time.Minute, func() bool { return r.Distinct() == pub.Count() })
	dups := r.Check(t, pub.Snapshot(), nil)
	t.Logf("%d messages, %d duplicates; forwarder stats %+v / %+v", pub.Count(), dups, a.Stats(), b.Stats())
	if a.Stats().Messages == 0 || b.Stats().Messages == 0 {
		t.Errorf("the instances did not share the work: %+v / %+v", a.Stats(), b.Stats())
	}
	if dups != 0 {
		t.Errorf("%d duplicates exactly once", dups)
	}
	for _, g := range r.Messages() {
		if g.BrokerPartition != g.OutboxPartition {
			t.Fatalf("key %s: Kafka partition %d, outbox partition %d", g.Key, g.BrokerPartition, g.OutboxPartition)
		}
		if g.Metadata.Get(outbox.MetadataAttempt) != "" {
			t.Fatalf("%s leaked to Kafka", outbox.MetadataAttempt)
		}
		want := outbox.StableID("orders", g.OutboxPartition, mustAtoi(t, g.Metadata.Get(outbox.MetadataSeq)))
		if g.ID != want {
			t.Fatalf("header %s = %q, want %q", outbox.MetadataID, g.ID, want)
		}
		if g.Metadata.Get(outbox.MetadataPartitionKey) != g.Key {
			t.Fatalf("header %s = %q, want %q", outbox.MetadataPartitionKey, g.Metadata.Get(outbox.MetadataPartitionKey), g.Key)
		}
		if strings.HasSuffix(g.Key, "-7") != (g.Metadata.Get("note") == "key seven") {
			t.Fatalf("metadata lost: %v", g.Metadata)
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

// Kafka goes away in the middle of the stream (every connection of the
// forwarder's target is cut, new ones refused: kafkatest.Outage, on kfake
// and on a real cluster alike) and comes back seconds later; meanwhile
// more messages are committed. The forwarder fails its sends, waits and
// resumes; nothing is lost, per-key order holds, and, exactly once, no
// message arrives twice.
func TestBrokerDownAndBackMidStream(t *testing.T) {
	for _, mode := range deliveryModes {
		t.Run(mode.name, func(t *testing.T) {
			e := fwdtest.NewEnv(t)
			e.Register("orders", 4)
			c := kafkatest.New(t)
			topic := c.Topic(t, "orders", 4, nil)
			outage := kafkatest.NewOutage(t)
			fwd := fwdtest.StartForwarder(t, e, nil, newTarget(t, c, mode.atLeastOnce, outage.Dialer()), []string{"orders"}, func(cfg *forwarder.Config) {
				cfg.TargetTopic = func(string) string { return topic }
			})

			pub := fwdtest.NewPublisher(t, e)
			stop := pub.Keep("orders", 12, 20*time.Millisecond)
			outboxtest.WaitFor(t, "a part of the stream forwarded", time.Minute, func() bool { return fwd.Stats().Messages > 300 })
			outage.Break()
			outboxtest.WaitFor(t, "failed sends while Kafka is down", time.Minute, func() bool { return fwd.Stats().Failures > 3 })
			time.Sleep(3 * time.Second)
			before := fwd.Stats()
			outage.Restore()
			time.Sleep(time.Second)
			stop()
			t.Logf("published %d; forwarded %d before the outage ended, %d failed sends (%s)", pub.Count(), before.Messages, before.Failures, before.LastError)

			r := &fwdtest.Received{}
			c.Consume(t, topic, r)
			outboxtest.WaitFor(t, "every message on Kafka", 2*time.Minute, func() bool { return r.Distinct() == pub.Count() })
			time.Sleep(500 * time.Millisecond) // copies, if any, arrive with the rest
			dups := r.Check(t, pub.Snapshot(), nil)
			t.Logf("%d messages arrived, %d duplicates; stats %+v", r.Total(), dups, fwd.Stats())
			if !mode.atLeastOnce && dups != 0 {
				t.Fatalf("%d duplicates exactly once", dups)
			}
		})
	}
}

// Produce requests fail now and then for one of the partitions they carry
// (8 outbox partitions onto 3 Kafka partitions, so a batch spans several):
// the forwarder retries the rest of each batch, loses nothing and keeps
// per-key order. At least once, records of other partitions that were
// stored are sent again, as duplicates of messages that arrived before;
// exactly once, the failed batch's transaction is aborted, so nothing of
// it is seen twice. With 8 outbox partitions onto 3, this is also the
// unequal-count case of exactly-once delivery.
//
// The target's clients do not retry (kgo.RecordRetries(0)), so that every
// injected failure fails its send, as a failure that outlasts kgo's
// retries does.
func TestTransientProduceErrors(t *testing.T) {
	for _, mode := range deliveryModes {
		t.Run(mode.name, func(t *testing.T) { testTransientProduceErrors(t, mode.atLeastOnce) })
	}
}

func testTransientProduceErrors(t *testing.T, atLeastOnce bool) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 8)
	c, cluster := kafkatest.NewFake(t, "a real broker fails a produce request for one of its partitions (NOT_ENOUGH_REPLICAS) only when replicas fall behind, which a test cannot cause on demand")
	topic := c.Topic(t, "orders", 3, nil)
	// Every third produce request that carries several partitions fails
	// for partition 1; its other partitions are stored.
	var produces, failed atomic.Int64
	decided := map[kmsg.Request]bool{} // used on the cluster goroutine only
	cluster.Fault(kfake.Fault{
		Keys:       []kmsg.Key{kmsg.Produce},
		Topic:      topic,
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
	fwd := fwdtest.StartForwarder(t, e, nil, newTarget(t, c, atLeastOnce, kgo.RecordRetries(0)), []string{"orders"}, func(cfg *forwarder.Config) {
		cfg.TargetTopic = func(string) string { return topic }
	})
	pub := fwdtest.NewPublisher(t, e)
	for i := 0; i < 30; i++ {
		pub.Round("orders", 24, nil)
	}
	r := &fwdtest.Received{}
	c.Consume(t, topic, r)
	outboxtest.WaitFor(t, "every message on Kafka", time.Minute, func() bool { return r.Distinct() == pub.Count() })
	time.Sleep(500 * time.Millisecond) // copies, if any, arrive with the rest
	dups := r.Check(t, pub.Snapshot(), nil)
	st := fwd.Stats()
	t.Logf("%d messages, %d duplicates, %d produce requests, %d failed in part; stats %+v", pub.Count(), dups, produces.Load(), failed.Load(), st)
	switch {
	case st.Failures == 0 || failed.Load() == 0:
		t.Fatal("no send failed in part: the fault injection did not work")
	case atLeastOnce && dups == 0:
		t.Fatal("no duplicates at least once: the partitions stored before the failure were not sent again")
	case !atLeastOnce && dups != 0:
		t.Fatalf("%d duplicates exactly once: a failed transaction's records were seen, or sent again after a commit", dups)
	}
}

// An instance dies after sending half a batch, before its cursor moved:
// the next owner gets the whole batch again. At least once, it sends the
// half again (copies with the same outbox_id); exactly once (the
// default), it reads the half back from Kafka and skips it.
func TestInstanceKilledMidBatch(t *testing.T) {
	for _, mode := range deliveryModes {
		t.Run(mode.name, func(t *testing.T) {
			e := fwdtest.NewEnv(t)
			e.Register("orders", 8)
			c := kafkatest.New(t)
			topic := c.Topic(t, "orders", 8, nil)
			mapping := func(cfg *forwarder.Config) { cfg.TargetTopic = func(string) string { return topic } }

			pub := fwdtest.NewPublisher(t, e)
			for i := 0; i < 40; i++ {
				pub.Round("orders", 16, nil)
			}
			poolA, freezeA, thawA := pgtest.FreezablePool(t)
			crashing := fwdtest.NewCrashingTarget(newTarget(t, c, mode.atLeastOnce), 100, freezeA)
			fwdtest.StartForwarder(t, e, poolA, crashing, []string{"orders"}, mapping)
			<-crashing.Crashed
			t.Cleanup(func() { thawA(); close(crashing.Release) }) // runs before A's Close

			b := fwdtest.StartForwarder(t, e, nil, newTarget(t, c, mode.atLeastOnce), []string{"orders"}, mapping)
			r := &fwdtest.Received{}
			c.Consume(t, topic, r)
			outboxtest.WaitFor(t, "every message on Kafka", time.Minute, func() bool { return r.Distinct() == pub.Count() })
			time.Sleep(500 * time.Millisecond) // copies, if any, arrive with the rest
			dups := r.Check(t, pub.Snapshot(), nil)
			t.Logf("A sent %d messages and half a batch (%d) before dying; %d duplicates; B %+v", crashing.Sent.Load(), crashing.HalfLen.Load(), dups, b.Stats())
			if crashing.HalfLen.Load() == 0 {
				t.Fatal("A did not send half a batch")
			}
			switch {
			case mode.atLeastOnce && dups < int(crashing.HalfLen.Load()):
				t.Fatalf("%d duplicates: the half batch A sent was not sent again by B", dups)
			case !mode.atLeastOnce && dups != 0:
				t.Fatalf("%d duplicates: B sent again what A had committed to Kafka", dups)
			}
		})
	}
}

// Poison: a message larger than the topic's max.message.bytes and one
// that the marshaler refuses go to the dead-letter table; the stream
// continues around them, in order.
func TestPoisonMessagesAreDeadLettered(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 4)
	const maxBytes = 64 << 10
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 4, map[string]string{"max.message.bytes": strconv.Itoa(maxBytes)})

	pub := fwdtest.NewPublisher(t, e)
	var big, reserved []string
	for i := 0; i < 20; i++ {
		pub.Round("orders", 10, func(m *message.Message) {
			switch m.Metadata.Get("n") + "/" + m.Metadata.Get(outbox.PublishPartitionKeyMetadata) {
			case "5/key-3", "12/key-8":
				m.Payload = make([]byte, 100<<10) // larger than the broker accepts
				big = append(big, m.UUID)
			case "9/key-1":
				m.Metadata.Set(kafka.UUIDHeaderKey, "x") // reserved by watermill-kafka
				reserved = append(reserved, m.UUID)
			}
		})
	}
	// The target's own limit (MaxBatchBytes) is above the topic's: the
	// broker refuses them.
	fwdtest.StartForwarder(t, e, nil, newTarget(t, c, false), []string{"orders"}, func(cfg *forwarder.Config) {
		cfg.TargetTopic = func(string) string { return topic }
	})
	r := &fwdtest.Received{}
	c.Consume(t, topic, r)
	want := len(big) + len(reserved)
	outboxtest.WaitFor(t, "every message forwarded or dead-lettered", time.Minute, func() bool {
		return r.Distinct() == pub.Count()-want && len(e.DeadLettered(t)) == want
	})
	dead := e.DeadLettered(t)
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
	r.Check(t, pub.Snapshot(), dead)
	time.Sleep(500 * time.Millisecond) // nothing else arrives late
	if n := r.Distinct(); n != pub.Count()-want {
		t.Fatalf("%d distinct messages arrived, want %d", n, pub.Count()-want)
	}
}

// The target's own limit (Config.MaxBatchBytes) rejects a record before
// it is sent: the message is dead-lettered at once.
func TestRecordOverMaxBatchBytesIsDeadLettered(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 2)
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 2, nil)
	pub := fwdtest.NewPublisher(t, e)
	var big string
	for i := 0; i < 5; i++ {
		pub.Round("orders", 4, func(m *message.Message) {
			if m.Metadata.Get("n") == "3" && m.Metadata.Get(outbox.PublishPartitionKeyMetadata) == "key-2" {
				m.Payload = make([]byte, 20<<10)
				big = m.UUID
			}
		})
	}
	target := newTargetWith(t, kafka.Config{Brokers: c.Brokers, MaxBatchBytes: 16 << 10})
	fwdtest.StartForwarder(t, e, nil, target, []string{"orders"}, func(cfg *forwarder.Config) {
		cfg.TargetTopic = func(string) string { return topic }
	})
	r := &fwdtest.Received{}
	c.Consume(t, topic, r)
	outboxtest.WaitFor(t, "every message forwarded or dead-lettered", time.Minute, func() bool {
		return r.Distinct() == pub.Count()-1 && len(e.DeadLettered(t)) == 1
	})
	dead := e.DeadLettered(t)
	if !strings.Contains(dead[big], "MaxBatchBytes") {
		t.Fatalf("dead letters %v, want %s for MaxBatchBytes", dead, big)
	}
	r.Check(t, pub.Snapshot(), dead)
}

// Close fails the sends in flight, waits until they returned and every
// client of the target is closed (no kgo goroutine left), and is
// idempotent; a Send after it is ErrClosed.
func TestCloseWaitsForTheSendsAndClosesEveryClient(t *testing.T) {
	for _, atLeastOnce := range []bool{false, true} {
		c := kafkatest.New(t)
		topic := c.Topic(t, "orders", 1, nil)
		before, _ := stackCounts()
		outage := kafkatest.NewOutage(t)
		target, err := kafka.NewTarget(kafka.Config{Brokers: c.Brokers, AtLeastOnce: atLeastOnce, ClientOptions: []kgo.Opt{outage.Dialer()}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		// One partition's client open, then Kafka unreachable: the next
		// send hangs until Close.
		if done, err := target.Send(outboxtest.Ctx(t), topic, fwdtest.OutboxBatch(3, fwdtest.SameKey)); done != 3 || err != nil {
			t.Fatalf("Send: done %d, %v", done, err)
		}
		outage.Break()
		sent := make(chan error, 1)
		go func() {
			_, err := target.Send(outboxtest.Ctx(t), topic, fwdtest.OutboxBatch(3, fwdtest.SameKey))
			sent <- err
		}()
		time.Sleep(500 * time.Millisecond)
		start := time.Now()
		if err := target.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-sent:
			if err == nil {
				t.Fatal("the send in flight succeeded with Kafka unreachable")
			}
		case <-time.After(time.Second): // the goroutine's own step after Send returned
			t.Fatal("Close returned before the send in flight")
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("Close took %v", d)
		}
		if err := target.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if _, err := target.Send(outboxtest.Ctx(t), topic, fwdtest.OutboxBatch(1, fwdtest.SameKey)); !errors.Is(err, outbox.ErrClosed) {
			t.Fatalf("Send after Close: %v, want ErrClosed", err)
		}
		outboxtest.WaitFor(t, "no kgo goroutine of the target left", 10*time.Second, func() bool {
			after, _ := stackCounts()
			return after <= before
		})
	}
}
