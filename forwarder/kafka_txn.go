package forwarder

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
)

// Exactly-once delivery into Kafka (the default of a KafkaTarget).
//
// Each outbox partition writes through its own Kafka transactional
// producer, transactional.id "<prefix>/<schema>/<group>/<topic>/<partition>",
// one transaction per batch. Two mechanisms, and both are needed:
//
//   - Fencing. The first send after a forwarder (re)gains a partition calls
//     InitProducerId with that id: the broker bumps the producer epoch,
//     aborts a transaction the previous owner left open, and from then on
//     refuses every write and commit of the previous owner. A zombie (an
//     instance frozen past its lease that wakes up and finishes its batch)
//     can no longer add a record, and what it wrote before is aborted:
//     invisible to read_committed consumers.
//   - Reading the tail. A previous owner may have committed its
//     transaction and died before the outbox cursor moved past the batch;
//     the cursor then hands the batch out again. So, after fencing, the
//     target reads the target partitions back (read_committed) to the last
//     record of this outbox partition and skips the messages whose seq is at
//     or below the seq it carries (header outbox_id "topic/partition/seq",
//     of the same topic incarnation). Reading the tail alone would not do:
//     a zombie could still write after it.
//
// With equal partition counts (and the default partitioner), outbox
// partition p writes only to Kafka partition p, and the tail read is one
// short fetch. With unequal counts a partition's records spread over every
// Kafka partition, and the tail read scans each of them back until it finds
// a record of the outbox partition, at most TailScanLimit records each.

// txnProducer is the transactional producer of one outbox partition.
// Sends of one outbox partition never overlap (the partition's lease), and
// mu serializes them anyway.
type txnProducer struct {
	id string
	mu sync.Mutex

	ready       bool // initialized and lastSeq known, for topic/incarnation
	topic       string
	incarnation string
	producerID  int64
	epoch       int16
	sequences   map[int32]int32 // next sequence number per Kafka partition
	lastSeq     int64           // last outbox seq committed to Kafka
}

func (t *KafkaTarget) txnProducer(o origin) *txnProducer {
	id := t.transactionalID(o)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.producers == nil {
		t.producers = map[string]*txnProducer{}
	}
	p := t.producers[id]
	if p == nil {
		p = &txnProducer{id: id}
		t.producers[id] = p
	}
	return p
}

func (t *KafkaTarget) transactionalID(o origin) string {
	parts := []string{t.cfg.TransactionalIDPrefix}
	if o.schema != "" || o.group != "" {
		parts = append(parts, o.schema, o.group)
	}
	parts = append(parts, o.topic, strconv.Itoa(o.partition))
	return strings.Join(parts, "/")
}

// sendExactlyOnce is Send with transactions; see the comment above.
func (t *KafkaTarget) sendExactlyOnce(ctx context.Context, client sarama.Client, topic string, partitions []int32, batch []*message.Message) (int, error) {
	o, err := originOf(ctx, batch)
	if err != nil {
		return 0, err
	}
	p := t.txnProducer(o)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ready || p.topic != topic || p.incarnation != o.incarnation {
		if err := t.initProducer(ctx, client, p, topic, partitions, o); err != nil {
			return 0, err
		}
	}

	// Skip what the partition already committed to Kafka.
	skip := 0
	for skip < len(batch) {
		s, _ := seqOf(batch[skip]) // checked by originOf
		if s > p.lastSeq {
			break
		}
		skip++
	}
	if skip > 0 {
		t.logger.Info("Skipping messages Kafka already holds (a previous owner committed them and stopped before the outbox cursor moved)", watermill.LogFields{
			"transactional_id": p.id, "from": batch[0].Metadata.Get(outbox.MetadataID), "skipped": skip,
		})
	}
	rest := batch[skip:]
	if len(rest) == 0 {
		return len(batch), nil
	}

	part := t.partitioner(topic)
	maxBytes := t.cfg.Sarama.Producer.MaxMessageBytes
	records := make([]outRecord, 0, len(rest))
	var bad error
	learn := t.cfg.Sarama.Producer.Compression == sarama.CompressionNone // see Send
	refusedAt := 0
	if learn {
		refusedAt = t.refusedAt(topic)
	}
	for i, msg := range rest {
		r, err := t.record(topic, msg, part, int32(len(partitions)))
		switch {
		case err != nil:
		case r.size+recordBatchOverhead > maxBytes:
			err = fmt.Errorf("record of %d bytes is larger than Producer.MaxMessageBytes (%d): %w", r.size, maxBytes, sarama.ErrMessageSizeTooLarge)
		case refusedAt > 0 && r.size+recordBatchOverhead >= refusedAt:
			err = fmt.Errorf("record of %d bytes: the broker refused a record of %d bytes as too large (its message.max.bytes) within the last %v: %w",
				r.size, refusedAt-recordBatchOverhead, refusedFor, sarama.ErrMessageSizeTooLarge)
		}
		if err != nil {
			bad = err
			break
		}
		r.index = i
		records = append(records, r)
	}
	// Each try is one transaction: aborted, nothing of it is visible. When
	// the broker refuses a record batch of several records for their size
	// or one invalid record, the next transactions hold fewer records until
	// the record to blame is first in line and alone: it is rejected on its
	// first attempt and the records before it are delivered, within this
	// Send (as without transactions; see KafkaTarget).
	sent, limit := 0, len(records)
	for sent < len(records) {
		end := min(len(records), sent+limit)
		failed, err := t.transact(ctx, client, p, topic, records[sent:end])
		if err == nil {
			p.lastSeq, _ = seqOf(rest[end-1])
			sent = end
			continue
		}
		var perm *permanentError
		var refused *refusedSetError
		switch {
		case failed < 0 || ctx.Err() != nil:
			return skip + sent, err
		case errors.As(err, &perm) && failed == 0:
			if learn && (errors.Is(perm.err, sarama.ErrMessageSizeTooLarge) || errors.Is(perm.err, sarama.ErrMessageSetSizeTooLarge)) {
				t.noteRefused(topic, records[sent].size+recordBatchOverhead)
			}
			return skip + sent, t.reject(rest[sent], perm.err)
		case errors.As(err, &perm):
			limit = failed // deliver the records before it, then it alone
		case errors.As(err, &refused):
			t.logger.Debug("Kafka refused a record batch: trying fewer records to find the record to blame", watermill.LogFields{
				"id": rest[sent+failed].Metadata.Get(outbox.MetadataID), "records": refused.records, "err": refused.err.Error(),
			})
			limit = failed + max(1, refused.records/2)
		default:
			return skip + sent, err
		}
		if err := t.initProducer(ctx, client, p, topic, partitions, o); err != nil {
			return skip + sent, err
		}
	}
	if bad != nil {
		return skip + len(records), t.reject(rest[len(records)], bad)
	}
	return len(batch), nil
}

// initProducer fences every earlier producer of p's transactional id and
// reads what the outbox partition already committed to topic.
func (t *KafkaTarget) initProducer(ctx context.Context, client sarama.Client, p *txnProducer, topic string, partitions []int32, o origin) error {
	p.ready = false
	var resp *sarama.InitProducerIDResponse
	err := t.coordinated(ctx, client, p.id, "init the transactional producer", func(b *sarama.Broker) (sarama.KError, error) {
		req := &sarama.InitProducerIDRequest{TransactionalID: &p.id, TransactionTimeout: t.cfg.TransactionTimeout}
		if t.cfg.Sarama.Version.IsAtLeast(sarama.V2_0_0_0) {
			req.Version = 1
		}
		r, err := b.InitProducerID(req)
		if err != nil {
			return 0, err
		}
		resp = r
		return r.Err, nil
	})
	if err != nil {
		return err
	}
	last, err := t.tailSeq(ctx, client, topic, partitions, o)
	if t.noTailRead {
		last = 0
	}
	if err != nil {
		return fmt.Errorf("forwarder: kafka: read what outbox partition %s/%d already wrote to %s: %w", o.topic, o.partition, topic, err)
	}
	p.producerID, p.epoch = resp.ProducerID, resp.ProducerEpoch
	p.sequences = map[int32]int32{}
	p.topic, p.incarnation, p.lastSeq = topic, o.incarnation, last
	p.ready = true
	t.logger.Debug("Transactional producer ready", watermill.LogFields{
		"transactional_id": p.id, "producer_id": p.producerID, "epoch": p.epoch, "last_seq": last,
	})
	return nil
}

// coordinated runs call against the transaction coordinator of id, again
// while the coordinator moves, loads, or finishes the previous
// transaction (CONCURRENT_TRANSACTIONS), until ctx ends.
func (t *KafkaTarget) coordinated(ctx context.Context, client sarama.Client, id, what string, call func(*sarama.Broker) (sarama.KError, error)) error {
	backoff := 5 * time.Millisecond
	for {
		b, err := client.TransactionCoordinator(id)
		var kerr sarama.KError
		if err == nil {
			kerr, err = call(b)
			if err != nil {
				_ = b.Close() // reconnect on the next call
			}
		}
		switch {
		case err == nil && kerr == sarama.ErrNoError:
			return nil
		case err == nil && (kerr == sarama.ErrNotCoordinatorForConsumer || kerr == sarama.ErrConsumerCoordinatorNotAvailable):
			_ = client.RefreshTransactionCoordinator(id)
		case err == nil && (kerr == sarama.ErrConcurrentTransactions || kerr == sarama.ErrOffsetsLoadInProgress):
		case err == nil:
			return fmt.Errorf("forwarder: kafka: %s (transactional id %s): %w", what, id, kerr)
		default:
			_ = client.RefreshTransactionCoordinator(id)
		}
		if err != nil {
			kerr = 0
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = kerr
			}
			return fmt.Errorf("forwarder: kafka: %s (transactional id %s): %w (%w)", what, id, context.Cause(ctx), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// transact writes records in one Kafka transaction and commits it. On any
// error the producer must be initialized again before its next
// transaction: that fences whatever this one left behind and tells, by the
// tail, whether its commit went through.
// It returns the position in records of the record a failed produce
// request failed at (-1: not a produce error).
func (t *KafkaTarget) transact(ctx context.Context, client sarama.Client, p *txnProducer, topic string, records []outRecord) (failed int, err error) {
	defer func() {
		if err != nil {
			p.ready = false
			t.abort(client, p)
		}
	}()
	var kafkaParts []int32
	seen := map[int32]bool{}
	for _, r := range records {
		if !seen[r.partition] {
			seen[r.partition] = true
			kafkaParts = append(kafkaParts, r.partition)
		}
	}
	err = t.coordinated(ctx, client, p.id, "add partitions to the transaction", func(b *sarama.Broker) (sarama.KError, error) {
		req := &sarama.AddPartitionsToTxnRequest{
			TransactionalID: p.id, ProducerID: p.producerID, ProducerEpoch: p.epoch,
			TopicPartitions: map[string][]int32{topic: kafkaParts},
		}
		if t.cfg.Sarama.Version.IsAtLeast(sarama.V2_0_0_0) {
			req.Version = 1
		}
		resp, err := b.AddPartitionsToTxn(req)
		if err != nil {
			return 0, err
		}
		// Every partition must be answered, and added: a produce to a
		// partition outside the transaction fails.
		answered := map[int32]bool{}
		for _, perr := range resp.Errors[topic] {
			if perr.Err != sarama.ErrNoError {
				return perr.Err, nil
			}
			answered[perr.Partition] = true
		}
		for _, kp := range kafkaParts {
			if !answered[kp] {
				return 0, fmt.Errorf("partition %d: %w", kp, sarama.ErrIncompleteResponse)
			}
		}
		return sarama.ErrNoError, nil
	})
	if err != nil {
		return -1, err
	}
	maxBytes := t.cfg.Sarama.Producer.MaxMessageBytes
	for start := 0; start < len(records); {
		end := start + chunkEnd(records[start:], 0, maxBytes)
		chunk := records[start:end]
		done, _, err := t.produce(ctx, client, topic, chunk, p)
		if done < len(chunk) {
			return start + done, err
		}
		for _, r := range chunk {
			p.sequences[r.partition]++
		}
		start = end
	}
	if t.beforeCommit != nil {
		t.beforeCommit()
	}
	return -1, t.endTxn(ctx, client, p, true)
}

func (t *KafkaTarget) endTxn(ctx context.Context, client sarama.Client, p *txnProducer, commit bool) error {
	what := "commit the transaction"
	if !commit {
		what = "abort the transaction"
	}
	return t.coordinated(ctx, client, p.id, what, func(b *sarama.Broker) (sarama.KError, error) {
		req := &sarama.EndTxnRequest{TransactionalID: p.id, ProducerID: p.producerID, ProducerEpoch: p.epoch, TransactionResult: commit}
		if t.cfg.Sarama.Version.IsAtLeast(sarama.V2_0_0_0) {
			req.Version = 1
		}
		resp, err := b.EndTxn(req)
		if err != nil {
			return 0, err
		}
		return resp.Err, nil
	})
}

// abort ends a failed transaction early, so that read_committed consumers
// are not held up until its timeout. It is best effort: the next
// InitProducerId aborts it anyway.
func (t *KafkaTarget) abort(client sarama.Client, p *txnProducer) {
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.Sarama.Net.ReadTimeout)
	defer cancel()
	if err := t.endTxn(ctx, client, p, false); err != nil {
		t.logger.Debug("Could not abort the transaction (the next owner's InitProducerId aborts it)", watermill.LogFields{"transactional_id": p.id, "err": err.Error()})
	}
}

// tailSeq returns the seq of the last record outbox partition o committed
// to topic (0: none found).
func (t *KafkaTarget) tailSeq(ctx context.Context, client sarama.Client, topic string, partitions []int32, o origin) (int64, error) {
	scan := partitions
	if o.partitions == len(partitions) {
		// Equal counts: keyed records of outbox partition p are on Kafka
		// partition p (murmur2 in both), keyless ones too
		// (Murmur2Partitioner). A partitioner of the user's own may place
		// them elsewhere, so this holds only for Murmur2Partitioner.
		if sameFunc(t.cfg.Sarama.Producer.Partitioner, NewMurmur2Partitioner) {
			scan = []int32{int32(o.partition)}
		}
	}
	var last int64
	for _, kp := range scan {
		s, err := t.partitionTailSeq(ctx, client, topic, kp, o)
		if err != nil {
			return 0, err
		}
		last = max(last, s)
	}
	return last, nil
}

// partitionTailSeq scans Kafka partition kp of topic backwards, in
// windows that double, for the last committed record of o.
func (t *KafkaTarget) partitionTailSeq(ctx context.Context, client sarama.Client, topic string, kp int32, o origin) (int64, error) {
	leader, err := client.Leader(topic, kp)
	if err != nil {
		_ = client.RefreshMetadata(topic)
		return 0, fmt.Errorf("leader of partition %d: %w", kp, err)
	}
	start, err := t.listOffset(leader, topic, kp, sarama.OffsetOldest)
	if err != nil {
		return 0, err
	}
	end, err := t.listOffset(leader, topic, kp, sarama.OffsetNewest) // read_committed: the last stable offset
	if err != nil {
		return 0, err
	}
	step, scanned := int64(256), int64(0)
	for end > start {
		if err := ctx.Err(); err != nil {
			return 0, context.Cause(ctx)
		}
		if scanned >= int64(t.cfg.TailScanLimit) {
			t.logger.Info("No record of the outbox partition in the scanned tail of the Kafka partition: if its last transaction is older, a message may be sent again (same outbox_id)", watermill.LogFields{
				"topic": topic, "kafka_partition": kp, "outbox_partition": o.partition, "scanned": scanned,
			})
			return 0, nil
		}
		from := max(start, end-step)
		s, err := t.scanRange(leader, topic, kp, from, end, o)
		if err != nil {
			return 0, err
		}
		if s > 0 {
			return s, nil
		}
		scanned += end - from
		end, step = from, step*2
	}
	return 0, nil
}

func (t *KafkaTarget) listOffset(b *sarama.Broker, topic string, kp int32, at int64) (int64, error) {
	req := &sarama.OffsetRequest{Version: 2, IsolationLevel: sarama.ReadCommitted}
	req.AddBlock(topic, kp, at, 1)
	resp, err := b.GetAvailableOffsets(req)
	if err != nil {
		_ = b.Close()
		return 0, fmt.Errorf("list offsets of partition %d: %w", kp, err)
	}
	block := resp.GetBlock(topic, kp)
	switch {
	case block == nil:
		return 0, fmt.Errorf("list offsets of partition %d: %w", kp, sarama.ErrIncompleteResponse)
	case block.Err != sarama.ErrNoError:
		return 0, fmt.Errorf("list offsets of partition %d: %w", kp, block.Err)
	}
	return block.Offset, nil
}

// scanRange reads the committed records of [from, end) of partition kp
// and returns the largest seq of o among them (0: none).
func (t *KafkaTarget) scanRange(b *sarama.Broker, topic string, kp int32, from, end int64, o origin) (int64, error) {
	var last int64
	for off := from; off < end; {
		req := &sarama.FetchRequest{Version: 5, MaxWaitTime: 0, MinBytes: 1, MaxBytes: 4 << 20, Isolation: sarama.ReadCommitted}
		req.AddBlock(topic, kp, off, 4<<20, -1)
		resp, err := b.Fetch(req)
		if err != nil {
			_ = b.Close()
			return 0, fmt.Errorf("fetch partition %d from offset %d: %w", kp, off, err)
		}
		block := resp.GetBlock(topic, kp)
		switch {
		case block == nil:
			return 0, fmt.Errorf("fetch partition %d from offset %d: %w", kp, off, sarama.ErrIncompleteResponse)
		case block.Err != sarama.ErrNoError:
			return 0, fmt.Errorf("fetch partition %d from offset %d: %w", kp, off, block.Err)
		}
		next := off
		aborted := block.AbortedTransactions
		abortedPIDs := map[int64]bool{}
		for _, rs := range block.RecordsSet {
			batch := rs.RecordBatch
			if batch == nil {
				continue // a message set of a pre-0.11 producer: no headers
			}
			lastOffset := batch.FirstOffset + int64(batch.LastOffsetDelta)
			for len(aborted) > 0 && aborted[0].FirstOffset <= lastOffset {
				abortedPIDs[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			if batch.PartialTrailingRecord && len(batch.Records) == 0 {
				break
			}
			next = max(next, lastOffset+1)
			if batch.Control {
				if len(batch.Records) > 0 && controlType(batch.Records[0].Key) == sarama.ControlRecordAbort {
					delete(abortedPIDs, batch.ProducerID)
				}
				continue
			}
			if batch.IsTransactional && abortedPIDs[batch.ProducerID] {
				continue
			}
			for _, r := range batch.Records {
				if at := batch.FirstOffset + r.OffsetDelta; at < from || at >= end {
					continue
				}
				if s := recordSeq(r, o); s > last {
					last = s
				}
			}
		}
		if next == off {
			break // nothing more below the last stable offset
		}
		off = next
	}
	return last, nil
}

// controlType decodes the type of a control record from its key (version
// int16, type int16).
func controlType(key []byte) sarama.ControlRecordType {
	if len(key) < 4 {
		return -1
	}
	return sarama.ControlRecordType(binary.BigEndian.Uint16(key[2:4]))
}

// recordSeq returns the outbox seq of r if it comes from the outbox
// partition of o (and the same incarnation of its topic), else 0.
func recordSeq(r *sarama.Record, o origin) int64 {
	var id, incarnation string
	for _, h := range r.Headers {
		switch string(h.Key) {
		case outbox.MetadataID:
			id = string(h.Value)
		case outbox.MetadataIncarnation:
			incarnation = string(h.Value)
		}
	}
	if id == "" || (o.incarnation != "" && incarnation != "" && incarnation != o.incarnation) {
		return 0
	}
	// "topic/partition/seq", the topic may hold slashes.
	i := strings.LastIndexByte(id, '/')
	if i < 0 {
		return 0
	}
	j := strings.LastIndexByte(id[:i], '/')
	if j < 0 || id[:j] != o.topic || id[j+1:i] != strconv.Itoa(o.partition) {
		return 0
	}
	s, err := strconv.ParseInt(id[i+1:], 10, 64)
	if err != nil {
		return 0
	}
	return s
}
