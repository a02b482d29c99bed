package forwarder_test

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Failure mode 4 of issue 10, at the level of one Send: a record the broker
// refuses for its own sake, in the middle of a batch, is found within that
// Send. The records before it are stored, it is rejected (so the
// Subscriber dead-letters it on its first attempt), nothing behind it in
// its partition is stored, and no record is stored twice.

// outboxBatch returns n messages as the Subscriber would deliver them from
// partition 0 of topic "orders": n consecutive seqs, stable ids, partition keys from
// key(i).
//
// Each call continues the seqs of the last, as the Subscriber's next batch
// would: an exactly-once target skips what it already wrote by seq.
func outboxBatch(n int, key func(i int) string) []*message.Message {
	batch := make([]*message.Message, n)
	for i := range batch {
		seq := lastBatchSeq.Add(1)
		m := message.NewMessage(watermill.NewUUID(), []byte("payload "+strconv.Itoa(i)))
		m.Metadata.Set(outbox.MetadataID, outbox.StableID("orders", 0, seq))
		m.Metadata.Set(outbox.MetadataTopic, "orders")
		m.Metadata.Set(outbox.MetadataPartition, "0")
		m.Metadata.Set(outbox.MetadataSeq, strconv.FormatInt(seq, 10))
		m.Metadata.Set(outbox.MetadataPartitionKey, key(i))
		m.Metadata.Set("i", strconv.Itoa(i))
		batch[i] = m
	}
	return batch
}

var lastBatchSeq atomic.Int64

func sameKey(int) string { return "key" }

// kafkaRecord is a record read back from Kafka.
type kafkaRecord struct {
	partition int32
	i         int // metadata "i": the position in the test's batch
	id        string
}

// kafkaLog reads every committed record of topic (read_committed, as
// consumers of an exactly-once target must), partition by partition in
// offset order.
func kafkaLog(t *testing.T, brokers []string, topic string) []kafkaRecord {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []kafkaRecord
	for _, p := range parts {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		if end == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
	read:
		for {
			var m *sarama.ConsumerMessage
			select {
			case m = <-pc.Messages():
			case <-time.After(time.Second):
				// The offsets up to end hold transaction markers and
				// aborted records: nothing more to read.
				break read
			}
			r := kafkaRecord{partition: p}
			for _, h := range m.Headers {
				switch string(h.Key) {
				case "i":
					r.i, _ = strconv.Atoi(string(h.Value))
				case outbox.MetadataID:
					r.id = string(h.Value)
				}
			}
			out = append(out, r)
			if m.Offset == end-1 {
				break
			}
		}
		_ = pc.Close()
	}
	return out
}

// positions returns the batch positions of records, in log order.
func positions(records []kafkaRecord) []int {
	out := make([]int, len(records))
	for i, r := range records {
		out[i] = r.i
	}
	return out
}

func upTo(from, to int, except ...int) []int {
	var out []int
next:
	for i := from; i < to; i++ {
		for _, e := range except {
			if i == e {
				continue next
			}
		}
		out = append(out, i)
	}
	return out
}

func assertPositions(t *testing.T, what string, got, want []int) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
}

func TestKafkaSendDeliversThePrefixAndRejectsTheOversizeRecord(t *testing.T) {
	const maxBytes = 64 << 10
	for _, poison := range []int{0, 7, 19} {
		t.Run("at "+strconv.Itoa(poison), func(t *testing.T) {
			cluster := newKafka(t, kfake.SeedTopics(1, "orders"), kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(maxBytes)}))
			brokers := cluster.ListenAddrs()
			target := newKafkaTarget(t, brokers, nil) // sarama's own limit is higher: the broker refuses it
			batch := outboxBatch(20, sameKey)
			batch[poison].Payload = make([]byte, 100<<10)

			done, err := target.Send(outboxtest.Ctx(t), "orders", batch)
			if done != poison || !errors.Is(err, outbox.ErrPoison) || !errors.Is(err, sarama.ErrMessageSizeTooLarge) {
				t.Fatalf("Send: done %d, %v; want %d and a rejection for MESSAGE_TOO_LARGE", done, err, poison)
			}
			assertPositions(t, "stored after the first Send", positions(kafkaLog(t, brokers, "orders")), upTo(0, poison))

			// The Subscriber moves past the poison and hands the rest over.
			rest := batch[poison+1:]
			if done, err := target.Send(outboxtest.Ctx(t), "orders", rest); done != len(rest) || err != nil {
				t.Fatalf("Send of the rest: done %d of %d, %v", done, len(rest), err)
			}
			assertPositions(t, "stored in the end", positions(kafkaLog(t, brokers, "orders")), upTo(0, 20, poison))
		})
	}
}

// A batch the broker refuses as too large although each of its records
// fits is split, and delivered whole by the same Send: nothing rejected.
func TestKafkaSendSplitsABatchTheBrokerFindsTooLarge(t *testing.T) {
	cluster := newKafka(t, kfake.SeedTopics(1, "orders"), kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(64 << 10)}))
	brokers := cluster.ListenAddrs()
	target := newKafkaTarget(t, brokers, nil)
	batch := outboxBatch(24, sameKey)
	for _, m := range batch {
		m.Payload = make([]byte, 10<<10) // 240 KiB in all
	}
	if done, err := target.Send(outboxtest.Ctx(t), "orders", batch); done != len(batch) || err != nil {
		t.Fatalf("Send: done %d of %d, %v", done, len(batch), err)
	}
	assertPositions(t, "stored", positions(kafkaLog(t, brokers, "orders")), upTo(0, 24))
}

// Without compression, the size of a record the broker refused alone is
// remembered for a while: a record at least that large is rejected without
// being sent. With compression the broker judges compressed sizes, so
// nothing is learned: a large record that compresses well is delivered.
func TestKafkaSendRemembersRefusedSizesOnlyWithoutCompression(t *testing.T) {
	incompressible := func(n int) []byte {
		b := make([]byte, n)
		_, _ = crand.Read(b)
		return b
	}
	for _, codec := range []sarama.CompressionCodec{sarama.CompressionNone, sarama.CompressionZSTD} {
		t.Run(codec.String(), func(t *testing.T) {
			cluster := newKafka(t, kfake.SeedTopics(1, "orders"), kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(64 << 10)}))
			sentBig := cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Observe: true, Count: -1,
				When: func(req kmsg.Request) bool { return hasHeader(req, "big") }})
			brokers := cluster.ListenAddrs()
			target := newKafkaTarget(t, brokers, func(c *sarama.Config) { c.Producer.Compression = codec })

			batch := outboxBatch(4, sameKey)
			batch[2].Payload = incompressible(100 << 10)
			batch[2].Metadata.Set("big", "random")
			if done, err := target.Send(outboxtest.Ctx(t), "orders", batch); done != 2 || !errors.Is(err, outbox.ErrPoison) {
				t.Fatalf("Send: done %d, %v; want 2 and a rejection", done, err)
			}
			asked := sentBig.Hits()

			batch = outboxBatch(4, sameKey)
			batch[1].Payload = make([]byte, 120<<10) // zeros: zstd makes little of them
			batch[1].Metadata.Set("big", "zeros")
			done, err := target.Send(outboxtest.Ctx(t), "orders", batch)
			if codec == sarama.CompressionNone {
				if done != 1 || !errors.Is(err, outbox.ErrPoison) || sentBig.Hits() != asked {
					t.Fatalf("Send: done %d, %v, %d more requests with the large record; want 1, a rejection, none", done, err, sentBig.Hits()-asked)
				}
				return
			}
			if done != 4 || err != nil {
				t.Fatalf("Send: done %d, %v; want all 4 delivered: compressed, the record fits", done, err)
			}
		})
	}
}

// hasHeader says whether a produce request carries, for topic, a record
// with header key.
func hasHeader(req kmsg.Request, key string) bool {
	pr, ok := req.(*kmsg.ProduceRequest)
	if !ok {
		return false
	}
	for _, rt := range pr.Topics {
		for _, rp := range rt.Partitions {
			var b kmsg.RecordBatch
			if b.ReadFrom(rp.Records) != nil {
				continue
			}
			for _, r := range readRecords(b) {
				for _, h := range r.Headers {
					if h.Key == key {
						return true
					}
				}
			}
		}
	}
	return false
}

// readRecords decodes the records of a record batch.
func readRecords(b kmsg.RecordBatch) []kmsg.Record {
	raw := b.Records
	if codec := b.Attributes & 0x07; codec != 0 {
		var err error
		if raw, err = kgo.DefaultDecompressor().Decompress(raw, kgo.CompressionCodecType(codec)); err != nil {
			return nil
		}
	}
	out := make([]kmsg.Record, 0, max(0, b.NumRecords))
	for i := 0; i < int(b.NumRecords) && len(raw) > 0; i++ {
		length, n := varint(raw)
		if n <= 0 || length < 0 || int(length)+n > len(raw) {
			break
		}
		var r kmsg.Record
		if r.ReadFrom(raw[:n+int(length)]) != nil {
			break
		}
		out = append(out, r)
		raw = raw[n+int(length):]
	}
	return out
}

func varint(b []byte) (int64, int) {
	var x uint64
	var s uint
	for i, c := range b {
		if i == 10 {
			return 0, -1
		}
		if c < 0x80 {
			x |= uint64(c) << s
			return int64(x>>1) ^ -int64(x&1), i + 1
		}
		x |= uint64(c&0x7f) << s
		s += 7
	}
	return 0, 0
}

// Any error the broker gives a record batch for one of its records
// (INVALID_RECORD here, as for a keyless record on a compacted topic) is
// isolated the same way; an error about the broker's state
// (NOT_ENOUGH_REPLICAS) stays transient: nothing is rejected.
func TestKafkaSendIsolatesAnInvalidRecordAndKeepsTransientErrorsTransient(t *testing.T) {
	cluster := newKafka(t, kfake.SeedTopics(1, "orders"))
	cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Err: kerr.InvalidRecord, Count: -1,
		When: func(req kmsg.Request) bool { return hasHeader(req, "invalid") }})
	cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Err: kerr.NotEnoughReplicas, Count: -1,
		When: func(req kmsg.Request) bool { return hasHeader(req, "replicas-missing") }})
	brokers := cluster.ListenAddrs()
	target := newKafkaTarget(t, brokers, nil)

	batch := outboxBatch(16, sameKey)
	batch[11].Metadata.Set("invalid", "yes")
	done, err := target.Send(outboxtest.Ctx(t), "orders", batch)
	if done != 11 || !errors.Is(err, outbox.ErrPoison) || !errors.Is(err, sarama.ErrInvalidRecord) {
		t.Fatalf("Send: done %d, %v; want 11 and a rejection for INVALID_RECORD", done, err)
	}
	assertPositions(t, "stored", positions(kafkaLog(t, brokers, "orders")), upTo(0, 11))

	batch = outboxBatch(16, sameKey)
	batch[5].Metadata.Set("replicas-missing", "yes")
	done, err = target.Send(outboxtest.Ctx(t), "orders", batch)
	if done != 0 || err == nil || errors.Is(err, outbox.ErrPoison) || !errors.Is(err, sarama.ErrNotEnoughReplicas) {
		t.Fatalf("Send: done %d, %v; want 0 and a transient NOT_ENOUGH_REPLICAS", done, err)
	}
}

// When the batch spans several Kafka partitions (8 outbox partitions onto
// 3, say), the request the broker refuses for one partition stores the
// record batches of the others, records behind the poison among them. The
// smaller requests that isolate the poison leave those out: the Send
// stores no record twice. (Once the poison is rejected, the next Send,
// which starts behind it, sends them again: duplicates with the same
// outbox_id, as for any partly failed batch.)
func TestKafkaSendStoresNoRecordTwiceWhileIsolating(t *testing.T) {
	cluster := newKafka(t, kfake.SeedTopics(3, "orders"), kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(64 << 10)}))
	brokers := cluster.ListenAddrs()
	target := newKafkaTarget(t, brokers, nil)
	// Keys of partition 0, 1 and 2 in turn.
	keyOf := map[int32][]string{}
	part := forwarder.NewMurmur2Partitioner("orders")
	for k := 0; len(keyOf[0]) == 0 || len(keyOf[1]) == 0 || len(keyOf[2]) == 0; k++ {
		key := "key-" + strconv.Itoa(k)
		p, _ := part.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, 3)
		keyOf[p] = append(keyOf[p], key)
	}
	batch := outboxBatch(24, func(i int) string { return keyOf[int32(i%3)][0] })
	const poison = 13 // in partition 1
	batch[poison].Payload = make([]byte, 100<<10)

	done, err := target.Send(outboxtest.Ctx(t), "orders", batch)
	if done != poison || !errors.Is(err, outbox.ErrPoison) {
		t.Fatalf("Send: done %d, %v; want %d and a rejection", done, err, poison)
	}
	stored := kafkaLog(t, brokers, "orders")
	seen := map[int]bool{}
	for _, r := range stored {
		if seen[r.i] {
			t.Fatalf("record %d stored twice: %v", r.i, positions(stored))
		}
		seen[r.i] = true
		if r.i%3 == 1 && r.i >= poison {
			t.Fatalf("record %d of the poison's partition, behind it, stored: %v", r.i, positions(stored))
		}
	}
	for i := range poison {
		if !seen[i] {
			t.Fatalf("record %d, before the poison, not stored: %v", i, positions(stored))
		}
	}
	byPartition := map[int32][]int{}
	for _, r := range stored {
		byPartition[r.partition] = append(byPartition[r.partition], r.i)
	}
	for p, is := range byPartition {
		for j := 1; j < len(is); j++ {
			if is[j] < is[j-1] {
				t.Fatalf("partition %d out of order: %v", p, is)
			}
		}
	}
	t.Logf("stored by the Send: %v", byPartition)
}

// attemptLog wraps a RejectHandler to record the attempts of each rejected
// message.
type attemptLog struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *attemptLog) wrap(h outbox.RejectHandler) outbox.RejectHandler {
	return outbox.RejectHandlerFunc(func(ctx context.Context, tx pgx.Tx, m outbox.RejectedMessage) error {
		a.mu.Lock()
		if a.n == nil {
			a.n = map[string]int{}
		}
		a.n[m.UUID] = m.Attempts
		a.mu.Unlock()
		return h.HandleReject(ctx, tx, m)
	})
}

func (a *attemptLog) of(uuid string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[uuid]
}
