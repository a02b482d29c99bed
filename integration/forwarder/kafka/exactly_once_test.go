package kafka_test

import (
	"errors"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/forward"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/kafkaseam"
	"github.com/millrace/watermill-outbox/internal/origin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Why exactly-once delivery uses both Kafka transactions and the tail
// read. Each case plays a takeover of one outbox partition by hand: owner
// A sends a batch, and before its cursor moves the partition goes to owner
// B, which gets the same batch from the cursor.

// A zombie: A has written its batch in a transaction and freezes before
// the commit; B takes over and sends the batch; A wakes up and commits.
// B's InitProducerId fenced A and aborted its transaction, so A's commit
// fails and its records stay invisible: the topic holds the batch once.
// (Reading the tail alone would not help here: when B read it, A's
// records were not committed, and A's commit came after.)
func TestZombieIsFencedByTheNextOwner(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto.name, func(t *testing.T) { testZombieIsFencedByTheNextOwner(t, proto.opts) })
	}
}

// protocols are the request versions the exactly-once tests run with: the
// newest both sides know (KIP-890: a produce request adds its partition to
// the transaction), and Kafka 3.6's (AddPartitionsToTxn).
var protocols = []struct {
	name string
	opts []kgo.Opt
}{{"current protocol", nil}, {"Kafka 3.6 protocol", []kgo.Opt{kgo.MaxVersions(kversion.V3_6_0())}}}

func testZombieIsFencedByTheNextOwner(t *testing.T, opts []kgo.Opt) {
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 1, nil)
	a := newTarget(t, c, false, opts...)
	b := newTarget(t, c, false, opts...)
	frozen, wake := make(chan struct{}), make(chan struct{})
	zombie := kafkaseam.With(outboxtest.Ctx(t), kafkaseam.Seams{BeforeCommit: func() {
		close(frozen)
		<-wake
	}})
	// The targets share the partition's writer record, as two forwarders
	// of a group share its cursor row; B's lease is the newer.
	rec := &writerRecord{}
	batch := underLease(fwdtest.OutboxBatch(10, fwdtest.SameKey), 1, rec)
	batchB := underLease(fwdtest.OutboxBatch(10, fwdtest.SameKey), 2, rec)

	aDone := make(chan error, 1)
	go func() {
		done, err := a.Send(zombie, topic, batch)
		if err == nil && done != len(batch) {
			err = errors.New("partial send without error")
		}
		aDone <- err
	}()
	<-frozen
	if done, err := b.Send(outboxtest.Ctx(t), topic, batchB); done != len(batchB) || err != nil {
		t.Fatalf("B: done %d of %d, %v", done, len(batchB), err)
	}
	close(wake)
	err := <-aDone
	// B fenced A's transactional id with an InitProducerId of its own,
	// which aborted A's transaction: the coordinator answers A's EndTxn
	// with PRODUCER_FENCED or INVALID_PRODUCER_EPOCH, or (kfake, which
	// checks the state first) INVALID_TXN_STATE.
	if !errors.Is(err, kerr.ProducerFenced) && !errors.Is(err, kerr.InvalidProducerEpoch) && !errors.Is(err, kerr.InvalidTxnState) {
		t.Fatalf("the zombie's commit: %v; want it fenced (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH or INVALID_TXN_STATE)", err)
	}
	fwdtest.AssertPositions(t, "committed records", positions(kafkaLog(t, c, topic)), fwdtest.UpTo(0, 10))
	// The zombie's records were written, in its transaction that B's
	// fencing aborted: a read_uncommitted consumer sees them too.
	fwdtest.AssertPositions(t, "every record, aborted ones included", positions(records(c.ReadUncommitted(t, topic))), append(fwdtest.UpTo(0, 10), fwdtest.UpTo(0, 10)...))
}

// A committed its batch to Kafka and died before its cursor moved. B, after
// fencing A, reads what the partition wrote last and skips it: the topic
// holds the batch once. With transactions alone (no tail read), B sends
// the batch again: copies.
func TestCommittedBatchIsNotSentAgainByTheNextOwner(t *testing.T) {
	for _, tail := range []bool{true, false} {
		name := "with the tail read"
		if !tail {
			name = "transactions alone"
		}
		t.Run(name, func(t *testing.T) {
			c := kafkatest.New(t)
			topic := c.Topic(t, "orders", 1, nil)
			a := newTarget(t, c, false)
			b := newTarget(t, c, false)
			ctxB := outboxtest.Ctx(t)
			if !tail {
				ctxB = kafkaseam.With(ctxB, kafkaseam.Seams{NoTailRead: true})
			}
			batch := fwdtest.OutboxBatch(10, fwdtest.SameKey)
			if done, err := a.Send(outboxtest.Ctx(t), topic, batch[:6]); done != 6 || err != nil {
				t.Fatalf("A: done %d, %v", done, err)
			}
			// A dies here; B gets the whole batch from the cursor.
			if done, err := b.Send(ctxB, topic, batch); done != len(batch) || err != nil {
				t.Fatalf("B: done %d of %d, %v", done, len(batch), err)
			}
			got := positions(kafkaLog(t, c, topic))
			if tail {
				fwdtest.AssertPositions(t, "committed records", got, fwdtest.UpTo(0, 10))
				return
			}
			fwdtest.AssertPositions(t, "committed records without the tail read", got, append(fwdtest.UpTo(0, 6), fwdtest.UpTo(0, 10)...))
		})
	}
}

// A real transaction coordinator answers CONCURRENT_TRANSACTIONS while it
// completes the previous transaction, COORDINATOR_LOAD_IN_PROGRESS while it
// loads, NOT_COORDINATOR after it moved: kgo waits and asks again, within
// the same Send, and the batch arrives once. With the current protocol
// (KIP-890 part 2) a produce request adds its partitions to the
// transaction; with Kafka 3.6's (the client limited to its request
// versions), AddPartitionsToTxn does, and is retried too.
func TestTransactionWaitsForABusyCoordinator(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto.name, func(t *testing.T) {
			c, cluster := kafkatest.NewFake(t, "a real coordinator is busy, loading or moved only at moments a test cannot choose; kfake injects those answers")
			topic := c.Topic(t, "orders", 1, nil)
			faults := []kfake.Fault{
				{Keys: []kmsg.Key{kmsg.InitProducerID}, Err: kerr.ConcurrentTransactions, Count: 2},
				{Keys: []kmsg.Key{kmsg.InitProducerID}, Err: kerr.CoordinatorLoadInProgress, Count: 1},
				{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.NotCoordinator, Count: 1},
				{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.ConcurrentTransactions, Count: 1},
			}
			if proto.opts != nil {
				faults = append(faults,
					kfake.Fault{Keys: []kmsg.Key{kmsg.AddPartitionsToTxn}, Err: kerr.ConcurrentTransactions, Count: 2},
					kfake.Fault{Keys: []kmsg.Key{kmsg.AddPartitionsToTxn}, Err: kerr.CoordinatorLoadInProgress, Count: 1},
				)
			}
			var handles []*kfake.FaultHandle
			for _, f := range faults {
				handles = append(handles, cluster.Fault(f))
			}
			target := newTarget(t, c, false, proto.opts...)
			batch := fwdtest.OutboxBatch(10, fwdtest.SameKey)
			if done, err := target.Send(outboxtest.Ctx(t), topic, batch); done != len(batch) || err != nil {
				t.Fatalf("Send: done %d of %d, %v", done, len(batch), err)
			}
			for i, f := range handles {
				if f.Hits() == 0 {
					t.Fatalf("fault %d (%v) was not hit: the test did not exercise the retry", i, faults[i].Keys)
				}
			}
			fwdtest.AssertPositions(t, "committed records", positions(kafkaLog(t, c, topic)), fwdtest.UpTo(0, 10))
		})
	}
}

// partitionBatch returns n messages of outbox partition p of topic
// "orders" with consecutive seqs from first, keys spread over many Kafka
// partitions, metadata "i" = i.
func partitionBatch(p int, first int64, n int) []*message.Message {
	batch := make([]*message.Message, n)
	for i := range batch {
		seq := first + int64(i)
		m := message.NewMessage(watermill.NewUUID(), []byte("payload "+strconv.Itoa(i)))
		m.Metadata.Set(outbox.MetadataID, outbox.StableID("orders", p, seq))
		m.Metadata.Set(outbox.MetadataTopic, "orders")
		m.Metadata.Set(outbox.MetadataPartition, strconv.Itoa(p))
		m.Metadata.Set(outbox.MetadataSeq, strconv.FormatInt(seq, 10))
		m.Metadata.Set(outbox.MetadataPartitionKey, "p"+strconv.Itoa(p)+"-key-"+strconv.Itoa(i))
		m.Metadata.Set("i", strconv.Itoa(i))
		batch[i] = m
	}
	return batch
}

// With unequal partition counts (8 outbox partitions onto 3 Kafka
// partitions) an outbox partition's records spread over every Kafka
// partition, and other outbox partitions write behind them. A committed
// the first half of a batch of outbox partition 0 and died; partitions 1
// to 7 wrote 20 records each since. B's tail read scans each Kafka
// partition back past their records to partition 0's last one and skips
// the half: no copies. With TailScanLimit below what the others wrote,
// the tail read gives up before it gets there (and logs it): B sends the
// half again, the limit docs/forwarder.md states.
func TestCommittedBatchIsNotSentAgainWithUnequalPartitionCounts(t *testing.T) {
	for _, limit := range []int{0, 10} {
		t.Run("TailScanLimit "+strconv.Itoa(limit), func(t *testing.T) {
			c := kafkatest.New(t)
			topic := c.Topic(t, "orders", 3, nil)
			// As a Forwarder says it (its origin): the outbox topic has 8
			// partitions.
			ctx := outboxtest.Ctx(t)
			from := origin.Origin{Schema: "schema", Group: "group", Partitions: 8}
			a := newTarget(t, c, false)
			batch := partitionBatch(0, 1, 12)
			if done, err := forward.Direct(a)(ctx, from, topic, batch[:6]); done != 6 || err != nil {
				t.Fatalf("A: done %d, %v", done, err)
			}
			others := newTarget(t, c, false)
			for p := 1; p < 8; p++ {
				if done, err := forward.Direct(others)(ctx, from, topic, partitionBatch(p, 1, 20)); done != 20 || err != nil {
					t.Fatalf("partition %d: done %d, %v", p, done, err)
				}
			}
			// A dies here; B gets the whole batch from the cursor.
			b := newTargetWith(t, kafka.Config{Brokers: c.Brokers, TailScanLimit: limit})
			if done, err := forward.Direct(b)(ctx, from, topic, batch); done != len(batch) || err != nil {
				t.Fatalf("B: done %d of %d, %v", done, len(batch), err)
			}
			var got []int
			for _, r := range c.ReadCommitted(t, topic) {
				if strings.HasPrefix(kafkatest.Header(r, outbox.MetadataID), "orders/0/") {
					got = append(got, atoi(kafkatest.Header(r, "i")))
				}
			}
			sort.Ints(got)
			if limit == 0 {
				fwdtest.AssertPositions(t, "records of outbox partition 0", got, fwdtest.UpTo(0, 12))
				return
			}
			want := append(fwdtest.UpTo(0, 12), fwdtest.UpTo(0, 6)...)
			sort.Ints(want)
			fwdtest.AssertPositions(t, "records of outbox partition 0 past the TailScanLimit", got, want)
		})
	}
}
