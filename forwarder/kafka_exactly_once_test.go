package forwarder_test

import (
	"errors"
	"testing"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/watermill-outbox/forwarder"
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
func TestKafkaZombieIsFencedByTheNextOwner(t *testing.T) {
	cluster := newKafka(t, kfake.SeedTopics(1, "orders"))
	brokers := cluster.ListenAddrs()
	a := newKafkaTarget(t, brokers, nil)
	b := newKafkaTarget(t, brokers, nil)
	frozen, wake := make(chan struct{}), make(chan struct{})
	forwarder.BeforeCommit(a, func() {
		close(frozen)
		<-wake
	})
	batch := outboxBatch(10, sameKey)

	aDone := make(chan error, 1)
	go func() {
		done, err := a.Send(outboxtest.Ctx(t), "orders", batch)
		if err == nil && done != len(batch) {
			err = errors.New("partial send without error")
		}
		aDone <- err
	}()
	<-frozen
	if done, err := b.Send(outboxtest.Ctx(t), "orders", batch); done != len(batch) || err != nil {
		t.Fatalf("B: done %d of %d, %v", done, len(batch), err)
	}
	close(wake)
	err := <-aDone
	if !errors.Is(err, sarama.ErrProducerFenced) && !errors.Is(err, sarama.ErrInvalidProducerEpoch) {
		t.Fatalf("the zombie's commit: %v; want it fenced (PRODUCER_FENCED or INVALID_PRODUCER_EPOCH)", err)
	}
	assertPositions(t, "committed records", positions(kafkaLog(t, brokers, "orders")), upTo(0, 10))
}

// A committed its batch to Kafka and died before its cursor moved. B, after
// fencing A, reads what the partition wrote last and skips it: the topic
// holds the batch once. With transactions alone (no tail read), B sends
// the batch again: copies.
func TestKafkaCommittedBatchIsNotSentAgainByTheNextOwner(t *testing.T) {
	for _, tail := range []bool{true, false} {
		name := "with the tail read"
		if !tail {
			name = "transactions alone"
		}
		t.Run(name, func(t *testing.T) {
			cluster := newKafka(t, kfake.SeedTopics(1, "orders"))
			brokers := cluster.ListenAddrs()
			a := newKafkaTarget(t, brokers, nil)
			b := newKafkaTarget(t, brokers, nil)
			if !tail {
				forwarder.WithoutTailRead(b)
			}
			batch := outboxBatch(10, sameKey)
			if done, err := a.Send(outboxtest.Ctx(t), "orders", batch[:6]); done != 6 || err != nil {
				t.Fatalf("A: done %d, %v", done, err)
			}
			// A dies here; B gets the whole batch from the cursor.
			if done, err := b.Send(outboxtest.Ctx(t), "orders", batch); done != len(batch) || err != nil {
				t.Fatalf("B: done %d of %d, %v", done, len(batch), err)
			}
			got := positions(kafkaLog(t, brokers, "orders"))
			if tail {
				assertPositions(t, "committed records", got, upTo(0, 10))
				return
			}
			assertPositions(t, "committed records without the tail read", got, append(upTo(0, 6), upTo(0, 10)...))
		})
	}
}

// A real transaction coordinator answers CONCURRENT_TRANSACTIONS while it
// completes the previous transaction, COORDINATOR_LOAD_IN_PROGRESS while it
// loads, NOT_COORDINATOR after it moved (kfake completes transactions at
// once and never does, so the faults are injected): the target waits and
// asks again, within the same Send, and the batch arrives once.
func TestKafkaTransactionWaitsForABusyCoordinator(t *testing.T) {
	cluster := newKafka(t, kfake.SeedTopics(1, "orders"))
	brokers := cluster.ListenAddrs()
	var faults []*kfake.FaultHandle
	for _, f := range []kfake.Fault{
		{Keys: []kmsg.Key{kmsg.InitProducerID}, Err: kerr.ConcurrentTransactions, Count: 2},
		{Keys: []kmsg.Key{kmsg.AddPartitionsToTxn}, Err: kerr.ConcurrentTransactions, Count: 2},
		{Keys: []kmsg.Key{kmsg.AddPartitionsToTxn}, Err: kerr.CoordinatorLoadInProgress, Count: 1},
		{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.NotCoordinator, Count: 1},
	} {
		faults = append(faults, cluster.Fault(f))
	}
	target := newKafkaTarget(t, brokers, nil)
	batch := outboxBatch(10, sameKey)
	if done, err := target.Send(outboxtest.Ctx(t), "orders", batch); done != len(batch) || err != nil {
		t.Fatalf("Send: done %d of %d, %v", done, len(batch), err)
	}
	for i, f := range faults {
		if f.Hits() == 0 {
			t.Fatalf("fault %d was not hit: the test did not exercise the retry", i)
		}
	}
	assertPositions(t, "committed records", positions(kafkaLog(t, brokers, "orders")), upTo(0, 10))
}
