package kafka_test

import (
	crand "crypto/rand"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Failure mode 4 of issue 10, at the level of one Send: a record the broker
// refuses for its own sake, in the middle of a batch, is found within that
// Send. The records before it are stored, it is rejected (so the
// Subscriber dead-letters it on its first attempt), nothing behind it in
// its partition is stored, and no record is stored twice. The broker's
// limit is the topic's max.message.bytes (64 KiB), the target's own
// (MaxBatchBytes) is higher.

const topicMaxBytes = 64 << 10

func smallTopic(t *testing.T, c *kafkatest.Cluster, partitions int) string {
	t.Helper()
	return c.Topic(t, "orders", partitions, map[string]string{"max.message.bytes": strconv.Itoa(topicMaxBytes)})
}

func TestSendDeliversThePrefixAndRejectsTheOversizeRecord(t *testing.T) {
	for _, mode := range deliveryModes {
		for _, poison := range []int{0, 7, 19} {
			t.Run(mode.name+"/at "+strconv.Itoa(poison), func(t *testing.T) {
				c := kafkatest.New(t)
				topic := smallTopic(t, c, 1)
				target := newTarget(t, c, mode.atLeastOnce)
				batch := fwdtest.OutboxBatch(20, fwdtest.SameKey)
				batch[poison].Payload = make([]byte, 100<<10)

				done, err := target.Send(outboxtest.Ctx(t), topic, batch)
				if done != poison || !errors.Is(err, outbox.ErrPoison) || !errors.Is(err, kerr.MessageTooLarge) {
					t.Fatalf("Send: done %d, %v; want %d and a rejection for MESSAGE_TOO_LARGE", done, err, poison)
				}
				fwdtest.AssertPositions(t, "stored after the first Send", positions(kafkaLog(t, c, topic)), fwdtest.UpTo(0, poison))

				// The Subscriber moves past the poison and hands the rest over.
				rest := batch[poison+1:]
				if done, err := target.Send(outboxtest.Ctx(t), topic, rest); done != len(rest) || err != nil {
					t.Fatalf("Send of the rest: done %d of %d, %v", done, len(rest), err)
				}
				fwdtest.AssertPositions(t, "stored in the end", positions(kafkaLog(t, c, topic)), fwdtest.UpTo(0, 20, poison))
			})
		}
	}
}

// A batch the broker refuses as too large although each of its records
// fits is split, and delivered whole by the same Send: nothing rejected.
func TestSendSplitsABatchTheBrokerFindsTooLarge(t *testing.T) {
	c := kafkatest.New(t)
	topic := smallTopic(t, c, 1)
	target := newTarget(t, c, false)
	batch := fwdtest.OutboxBatch(24, fwdtest.SameKey)
	for _, m := range batch {
		m.Payload = make([]byte, 10<<10) // 240 KiB in all
	}
	if done, err := target.Send(outboxtest.Ctx(t), topic, batch); done != len(batch) || err != nil {
		t.Fatalf("Send: done %d of %d, %v", done, len(batch), err)
	}
	fwdtest.AssertPositions(t, "stored", positions(kafkaLog(t, c, topic)), fwdtest.UpTo(0, 24))
}

// bigRecords counts the records with header "big" handed to a client for
// producing (kgo.HookProduceRecordBuffered).
type bigRecords struct{ n atomic.Int64 }

func (b *bigRecords) OnProduceRecordBuffered(r *kgo.Record) {
	if kafkatest.Header(r, "big") != "" {
		b.n.Add(1)
	}
}

// Without compression, the size of a record the broker refused alone is
// remembered for a while: a record at least that large is rejected without
// being sent. With compression the broker judges compressed sizes, so
// nothing is learned: a large record that compresses well is delivered.
func TestSendRemembersRefusedSizesOnlyWithoutCompression(t *testing.T) {
	incompressible := func(n int) []byte {
		b := make([]byte, n)
		_, _ = crand.Read(b)
		return b
	}
	for _, codec := range []struct {
		name  string
		codec kgo.CompressionCodec
	}{{"none", kgo.NoCompression()}, {"zstd", kgo.ZstdCompression()}} {
		t.Run(codec.name, func(t *testing.T) {
			c := kafkatest.New(t)
			topic := smallTopic(t, c, 1)
			sentBig := &bigRecords{}
			target := newTarget(t, c, false, kgo.ProducerBatchCompression(codec.codec), kgo.WithHooks(sentBig))

			batch := fwdtest.OutboxBatch(4, fwdtest.SameKey)
			batch[2].Payload = incompressible(100 << 10)
			batch[2].Metadata.Set("big", "random")
			if done, err := target.Send(outboxtest.Ctx(t), topic, batch); done != 2 || !errors.Is(err, outbox.ErrPoison) {
				t.Fatalf("Send: done %d, %v; want 2 and a rejection", done, err)
			}
			asked := sentBig.n.Load()
			if asked == 0 {
				t.Fatal("the first large record was not sent: nothing was learned from the broker")
			}

			batch = fwdtest.OutboxBatch(4, fwdtest.SameKey)
			batch[1].Payload = make([]byte, 120<<10) // zeros: zstd makes little of them
			batch[1].Metadata.Set("big", "zeros")
			done, err := target.Send(outboxtest.Ctx(t), topic, batch)
			if codec.name == "none" {
				if done != 1 || !errors.Is(err, outbox.ErrPoison) || sentBig.n.Load() != asked {
					t.Fatalf("Send: done %d, %v, %d more sends of the large record; want 1, a rejection, none", done, err, sentBig.n.Load()-asked)
				}
				return
			}
			if done != 4 || err != nil {
				t.Fatalf("Send: done %d, %v; want all 4 delivered: compressed, the record fits", done, err)
			}
		})
	}
}

// Any error the broker gives a record batch for one of its records
// (INVALID_RECORD here, as for a keyless record on a compacted topic) is
// isolated the same way; an error about the broker's state
// (NOT_ENOUGH_REPLICAS) stays transient: nothing is rejected.
func TestSendIsolatesAnInvalidRecordAndKeepsTransientErrorsTransient(t *testing.T) {
	c, cluster := kafkatest.NewFake(t, "a real broker answers INVALID_RECORD and NOT_ENOUGH_REPLICAS for chosen records only through kfake's fault injection")
	topic := c.Topic(t, "orders", 1, nil)
	cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.InvalidRecord, Count: -1,
		When: func(req kmsg.Request) bool { return hasHeader(req, "invalid") }})
	cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: -1,
		When: func(req kmsg.Request) bool { return hasHeader(req, "replicas-missing") }})
	target := newTarget(t, c, false)

	batch := fwdtest.OutboxBatch(16, fwdtest.SameKey)
	batch[11].Metadata.Set("invalid", "yes")
	done, err := target.Send(outboxtest.Ctx(t), topic, batch)
	if done != 11 || !errors.Is(err, outbox.ErrPoison) || !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("Send: done %d, %v; want 11 and a rejection for INVALID_RECORD", done, err)
	}
	fwdtest.AssertPositions(t, "stored", positions(kafkaLog(t, c, topic)), fwdtest.UpTo(0, 11))

	batch = fwdtest.OutboxBatch(16, fwdtest.SameKey)
	batch[5].Metadata.Set("replicas-missing", "yes")
	done, err = target.Send(outboxtest.Ctx(t), topic, batch)
	if done != 0 || err == nil || errors.Is(err, outbox.ErrPoison) || !errors.Is(err, kerr.NotEnoughReplicas) {
		t.Fatalf("Send: done %d, %v; want 0 and a transient NOT_ENOUGH_REPLICAS", done, err)
	}
}

// hasHeader says whether a produce request carries a record with header
// key.
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

// When the batch spans several Kafka partitions (8 outbox partitions onto
// 3, say), the request the broker refuses for one partition stores the
// record batches of the others, records behind the poison among them. The
// smaller sends that isolate the poison leave those out: the Send stores
// no record twice. (Once the poison is rejected, the next Send, which
// starts behind it, sends them again: duplicates with the same outbox_id,
// as for any partly failed batch.)
func TestSendStoresNoRecordTwiceWhileIsolating(t *testing.T) {
	for _, mode := range deliveryModes {
		t.Run(mode.name, func(t *testing.T) {
			c := kafkatest.New(t)
			topic := smallTopic(t, c, 3)
			target := newTarget(t, c, mode.atLeastOnce)
			// Keys of partition 0, 1 and 2 in turn.
			keyOf := map[int][]string{}
			part := kafka.Partitioner().ForTopic(topic)
			for k := 0; len(keyOf[0]) == 0 || len(keyOf[1]) == 0 || len(keyOf[2]) == 0; k++ {
				key := "key-" + strconv.Itoa(k)
				p := part.Partition(&kgo.Record{Key: []byte(key)}, 3)
				keyOf[p] = append(keyOf[p], key)
			}
			batch := fwdtest.OutboxBatch(24, func(i int) string { return keyOf[i%3][0] })
			const poison = 13 // in partition 1
			batch[poison].Payload = make([]byte, 100<<10)

			done, err := target.Send(outboxtest.Ctx(t), topic, batch)
			if done != poison || !errors.Is(err, outbox.ErrPoison) {
				t.Fatalf("Send: done %d, %v; want %d and a rejection", done, err, poison)
			}
			stored := kafkaLog(t, c, topic)
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
		})
	}
}

// A topic name Kafka refuses (INVALID_TOPIC_EXCEPTION) can never take a
// message: the first message is rejected, in both modes.
func TestSendRejectsForAnInvalidTopicName(t *testing.T) {
	for _, atLeastOnce := range []bool{false, true} {
		c := kafkatest.New(t)
		target := newTarget(t, c, atLeastOnce)
		batch := fwdtest.OutboxBatch(3, fwdtest.SameKey)
		done, err := target.Send(outboxtest.Ctx(t), "not a valid topic name!", batch)
		if done != 0 || !errors.Is(err, outbox.ErrPoison) || !errors.Is(err, kerr.InvalidTopicException) {
			t.Fatalf("at least once %v: Send: done %d, %v; want 0 and a rejection for INVALID_TOPIC_EXCEPTION", atLeastOnce, done, err)
		}
	}
}
