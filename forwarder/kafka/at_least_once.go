package kafka

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/origin"
)

// At-least-once delivery into Kafka (Config.AtLeastOnce).
//
// Each outbox partition produces through an idempotent producer (a kgo
// client) of its own that flushes by hand (kgo.ManualFlushing): a try hands the client
// all its records, then flushes, and the next try starts once the client
// holds nothing. Both halves are needed, for per-key order and for blaming
// the right record:
//
//   - When the broker refuses a record batch, kgo fails every record it
//     holds for that Kafka partition; but a record handed to it afterwards
//     goes into a new batch and may be stored. A client that sends while
//     records are still being handed over can thus store a later record of
//     a key and fail an earlier one, which arrives after it once sent
//     again. Flushing only once the last record is handed over makes what a
//     try stores of each Kafka partition a prefix of its records there.
//   - kgo puts records of several Sends for one Kafka partition into one
//     record batch. Through a client shared by every outbox partition, a
//     record too large for the broker failed another partition's records
//     along with its own, and a Send that found its one record failed took
//     it for the record to blame.
//
// The cost is a client per outbox partition an instance sent for within
// Config.ProducerIdleTimeout, as exactly once.

// atLeastOnceID names the producer of batch: its outbox partition's, or
// one for batches that are not one outbox partition's (a Send outside a
// Forwarder).
func (t *Target) atLeastOnceID(from origin.Origin, batch []*message.Message) string {
	if o, err := origin.Of(from, batch, "kafka"); err == nil {
		return "at-least-once:" + t.partitionTransactionalID(o)
	}
	return "at-least-once"
}

// atLeastOnceClient returns p's producer, made when p has none, and how
// many records it buffers (one try hands it at most these). p.mu is held.
func (t *Target) atLeastOnceClient(driver kafkadriver.Driver, p *producer) (kafkadriver.Idempotent, int, error) {
	if cl := p.client.Load(); cl != nil && cl.idem != nil {
		return cl.idem, cl.idem.Capacity(), nil
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, 0, outbox.ErrClosed
	}
	idem, err := driver.Idempotent()
	if err != nil {
		return nil, 0, err
	}
	p.client.Store(&producerClient{idem: idem})
	return idem, idem.Capacity(), nil
}

// sendAtLeastOnce is Send without transactions, on the producer of the
// batch's partition, held for the send.
func (t *Target) sendAtLeastOnce(ctx context.Context, driver kafkadriver.Driver, from origin.Origin, topic string, batch []*message.Message) (done int, err error) {
	err = t.withProducer(t.atLeastOnceID(from, batch), func(p *producer) error {
		done, err = t.sendOn(ctx, driver, p, topic, batch)
		return err
	})
	return done, err
}

// sendOn sends batch on p, which the caller holds.
func (t *Target) sendOn(ctx context.Context, driver kafkadriver.Driver, p *producer, topic string, batch []*message.Message) (int, error) {
	records, bad := t.build(ctx, topic, batch)
	// limit caps the records of a try once the broker refused a record
	// batch of several records: one of them is to blame, and halving the
	// try finds it within this Send, so that it is rejected on its first
	// attempt while the records before it are delivered.
	//
	// stored marks the records stored so far. A refused try may have
	// stored records of other Kafka partitions behind the refused one:
	// they are left out of the tries that follow, so that this Send
	// stores no record twice.
	stored := make([]bool, len(records))
	start, limit := 0, 0
	for start < len(records) {
		cl, capacity, err := t.atLeastOnceClient(driver, p)
		if err != nil {
			return start, err
		}
		var try []outRecord
		for _, r := range records[start:] {
			if !stored[r.index] {
				try = append(try, r)
			}
			if limit > 0 && len(try) == limit || len(try) == capacity {
				break
			}
		}
		errs, finished := cl.ProduceFlush(ctx, kgoRecords(try))
		if !finished {
			t.drop(p) // records in flight: the next try starts on an empty client
		}
		for i, err := range errs {
			if err == nil {
				stored[try[i].index] = true
			}
		}
		if f := firstFailed(errs); f >= 0 {
			i, err := try[f].index, errs[f]
			switch {
			case permanentForTopic(err):
				return i, t.reject(batch[i], err)
			case refusedForItsRecords(err) && partitionMates(try, f) == 1:
				if refusedForSize(err) && !t.compressed() {
					t.noteRefused(topic, records[i].size+recordBatchOverhead)
				}
				return i, t.reject(batch[i], err)
			case refusedForItsRecords(err) && ctx.Err() == nil:
				mates := partitionMates(try, f)
				t.logger.Debug("Kafka refused a record batch: trying fewer records to find the record to blame", watermill.LogFields{
					"id": batch[i].Metadata.Get(outbox.MetadataID), "records": mates, "err": err.Error(),
				})
				start, limit = i, max(1, mates/2)
				continue
			}
			return i, fmt.Errorf("kafka: %s: %w", topic, err)
		}
		for start < len(records) && stored[start] {
			start++
		}
	}
	if bad != nil {
		return len(records), t.reject(batch[len(records)], bad)
	}
	return len(batch), nil
}
