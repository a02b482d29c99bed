package kafka_test

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// At least once, a Send hands kgo every record of a try before any is
// sent, and each outbox partition has a client of its own. These tests
// give kgo the chance to do otherwise — a linger that ends while records
// are still being handed over, two partitions' records for one Kafka
// partition at the same time — and check that what the broker refuses is
// blamed on the right record and leaves nothing stored out of order.

// slowBuffering delays the handing over of the record whose header "i" is
// i (kgo.HookProduceRecordBuffered runs in Produce, before the record is
// buffered).
type slowBuffering struct {
	i     string
	delay time.Duration
}

func (s slowBuffering) OnProduceRecordBuffered(r *kgo.Record) {
	if kafkatest.Header(r, "i") == s.i {
		time.Sleep(s.delay)
	}
}

// Records 0 and 1 (too large for the broker) are handed over, then record 2
// comes 300 ms later, long after a 20 ms linger. Sent as they came, 0 and 1
// would be refused together and 2…5 stored ahead of 0, which goes again:
// 2 3 4 5 0, a key's order broken.
func TestAtLeastOnceStoresNoRecordBehindARefusedOne(t *testing.T) {
	c := kafkatest.New(t)
	topic := smallTopic(t, c, 1)
	target := newTarget(t, c, true, kgo.ProducerLinger(20*time.Millisecond), kgo.WithHooks(slowBuffering{"2", 300 * time.Millisecond}))
	batch := fwdtest.OutboxBatch(6, fwdtest.SameKey)
	batch[1].Payload = make([]byte, 100<<10)

	done, err := target.Send(outboxtest.Ctx(t), topic, batch)
	if done != 1 || !errors.Is(err, outbox.ErrPoison) || !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("Send: done %d, %v; want 1 and a rejection for MESSAGE_TOO_LARGE", done, err)
	}
	fwdtest.AssertPositions(t, "stored after the first Send", positions(kafkaLog(t, c, topic)), []int{0})

	if done, err := target.Send(outboxtest.Ctx(t), topic, batch[2:]); done != 4 || err != nil {
		t.Fatalf("Send of the rest: done %d of 4, %v", done, err)
	}
	fwdtest.AssertPositions(t, "stored in the end", positions(kafkaLog(t, c, topic)), fwdtest.UpTo(0, 6, 1))
}

// onPartition moves batch to outbox partition p.
func onPartition(batch []*message.Message, p int) []*message.Message {
	for _, m := range batch {
		seq, _ := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSeq), 10, 64)
		m.Metadata.Set(outbox.MetadataPartition, strconv.Itoa(p))
		m.Metadata.Set(outbox.MetadataID, outbox.StableID(m.Metadata.Get(outbox.MetadataTopic), p, seq))
	}
	return batch
}

// Outbox partitions 0 and 1 both write to the topic's one Kafka partition,
// at the same time, within a 200 ms linger. Partition 0's second record is
// too large for the broker; partition 1's one record is small. Through one
// shared client both Sends' records went into one record batch, the broker
// refused it, and partition 1's Send, its one record failed, rejected it
// as too large (and remembered its small size as refused).
func TestAtLeastOnceBlamesOnlyItsOwnRecords(t *testing.T) {
	c := kafkatest.New(t)
	topic := smallTopic(t, c, 1)
	target := newTarget(t, c, true, kgo.ProducerLinger(200*time.Millisecond))
	poisoned := fwdtest.OutboxBatch(2, fwdtest.SameKey)
	poisoned[1].Payload = make([]byte, 100<<10)
	innocent := onPartition(fwdtest.OutboxBatch(1, fwdtest.SameKey), 1)

	var wg sync.WaitGroup
	start := make(chan struct{})
	var poisonedDone, innocentDone int
	var poisonedErr, innocentErr error
	wg.Go(func() {
		<-start
		poisonedDone, poisonedErr = target.Send(outboxtest.Ctx(t), topic, poisoned)
	})
	wg.Go(func() {
		<-start
		innocentDone, innocentErr = target.Send(outboxtest.Ctx(t), topic, innocent)
	})
	close(start)
	wg.Wait()
	if poisonedDone != 1 || !errors.Is(poisonedErr, outbox.ErrPoison) {
		t.Errorf("partition 0's Send: done %d, %v; want 1 and a rejection", poisonedDone, poisonedErr)
	}
	if innocentDone != 1 || innocentErr != nil {
		t.Errorf("partition 1's Send: done %d, %v; want its one record stored", innocentDone, innocentErr)
	}
	// Nothing small is taken for too large afterwards.
	after := onPartition(fwdtest.OutboxBatch(1, fwdtest.SameKey), 1)
	if done, err := target.Send(outboxtest.Ctx(t), topic, after); done != 1 || err != nil {
		t.Errorf("a later small record: done %d, %v; want it stored", done, err)
	}
	stored := map[string]bool{}
	for _, r := range kafkaLog(t, c, topic) {
		stored[r.id] = true
	}
	for _, m := range []*message.Message{poisoned[0], innocent[0], after[0]} {
		if id := m.Metadata.Get(outbox.MetadataID); !stored[id] {
			t.Errorf("%s is not in Kafka; stored: %v", id, stored)
		}
	}
	if id := poisoned[1].Metadata.Get(outbox.MetadataID); stored[id] {
		t.Errorf("the rejected record %s is in Kafka", id)
	}
	if open := target.OpenProducers(); open != 2 {
		t.Errorf("OpenProducers = %d; want 2, one per outbox partition", open)
	}
}
