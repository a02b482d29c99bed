package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/kafkaseam"
	"github.com/millrace/watermill-outbox/internal/origin"
)

// Exactly-once delivery into Kafka (the default of a Target).
//
// Each outbox partition writes through a kgo transactional producer of its
// own, transactional.id "<prefix>/<schema>/<group>/<topic>/<partition>"
// ("<prefix>/source=<source>/<schema>/…" for a forwarder with a source:
// two databases have the same schemas, groups, topics and partitions), one
// transaction per batch. Two mechanisms, and both are needed:
//
//   - Fencing. When a forwarder (re)gains a partition, the producer's
//     InitProducerId (kgo's ProducerID) bumps the producer epoch: the
//     broker aborts a transaction the previous owner left open and from
//     then on refuses every write and commit of the previous owner. A
//     zombie (an instance frozen past its lease that wakes up and finishes
//     its batch) can no longer add a record, and what it wrote before is
//     aborted: invisible to read_committed consumers.
//   - Reading the tail. A previous owner may have committed its
//     transaction and died before the outbox cursor moved past the batch;
//     the cursor then hands the batch out again. So, after fencing, the
//     target reads the target partitions back, to the last committed record
//     of this outbox partition (partitionTailSeq says how it tells), and
//     skips the messages whose seq is at or below the seq it carries (header outbox_id "topic/partition/seq", of the same
//     topic incarnation and the same source, header outbox_source).
//     Reading the tail alone would not do: a zombie could still write
//     after it.
//
// The target counts on nothing it has not seen. The records of a
// transaction are all acknowledged before it is ended; a commit counts
// only when the driver confirms the broker committed it (kgo's
// EndTransaction(TryCommit) returns nil also when it ended the
// transaction with an abort: see kafkadriver.Transactional.End), and a
// transaction without that confirmation is treated as not sent: the
// producer is dropped, and its successor's tail read says what Kafka
// holds. A producer is used only by the lease it was fenced under (the
// delivery's fencing token, consumer.LeaseToken): a partition that
// changed hands and came back starts over with a new InitProducerId and
// tail read, since another owner may have written meanwhile. And a
// producer that saw any error is never used again: the next transaction
// fences and reads the tail first.
//
// With equal partition counts (and the default Key), outbox partition p
// writes only to Kafka partition p, and the tail read is one short read.
// With unequal counts a partition's records spread over every Kafka
// partition, and the tail read scans each of them back until it finds a
// record of the outbox partition, at most TailScanLimit records each.

func (t *Target) transactionalID(o origin.Origin) string {
	parts := []string{t.cfg.TransactionalIDPrefix}
	if o.Source != "" {
		parts = append(parts, "source="+o.Source)
	}
	if o.Schema != "" || o.Group != "" {
		parts = append(parts, o.Schema, o.Group)
	}
	parts = append(parts, o.Topic, strconv.Itoa(o.Partition))
	return strings.Join(parts, "/")
}

// sendExactlyOnce is Send with transactions; see the comment above.
func (t *Target) sendExactlyOnce(ctx context.Context, driver kafkadriver.Driver, topic string, batch []*message.Message) (int, error) {
	o, err := origin.Of(ctx, batch, "kafka")
	if err != nil {
		return 0, err
	}
	p, err := t.producer(t.transactionalID(o))
	if err != nil {
		return 0, err
	}
	defer p.mu.Unlock()
	if !p.ready || p.topic != topic || p.incarnation != o.Incarnation || (o.Token != 0 && p.token != o.Token) {
		if err := t.initProducer(ctx, driver, p, topic, o); err != nil {
			if permanentForTopic(err) {
				return 0, t.reject(batch[0], err)
			}
			return 0, err
		}
	}

	// Skip what the partition already committed to Kafka.
	skip := 0
	for skip < len(batch) {
		s, _ := origin.Seq(batch[skip], "kafka") // checked by origin.Of
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
	records, bad := t.build(ctx, topic, rest)
	// Each try is one transaction: aborted, nothing of it is visible. When
	// the broker refuses a record batch of several records for their size
	// or one invalid record, the next transactions hold fewer records until
	// the record to blame is first in line and alone: it is rejected on its
	// first attempt and the records before it are delivered, within this
	// Send.
	sent, limit := 0, len(records)
	for sent < len(records) {
		if !p.ready {
			if err := t.initProducer(ctx, driver, p, topic, o); err != nil {
				return skip + sent, err
			}
			// What the failed transaction left may have been committed
			// after all (a commit whose answer was lost): the tail says.
			for sent < len(records) {
				s, _ := origin.Seq(rest[sent], "kafka")
				if s > p.lastSeq {
					break
				}
				sent++
			}
			if sent == len(records) {
				break
			}
		}
		end := min(len(records), sent+limit)
		try := records[sent:end]
		f, err := t.transact(ctx, p, topic, try)
		if err == nil {
			p.lastSeq, _ = origin.Seq(rest[end-1], "kafka")
			sent = end
			continue
		}
		switch {
		case f < 0 || ctx.Err() != nil:
			return skip + sent, err
		case permanentForTopic(err) && f == 0:
			return skip + sent, t.reject(rest[sent], err)
		case permanentForTopic(err):
			limit = f // deliver the records before it, then it alone
		case !refusedForItsRecords(err):
			return skip + sent, err
		case partitionMates(try, f) == 1 && f == 0:
			if refusedForSize(err) && !t.compressed() {
				t.noteRefused(topic, try[0].size+recordBatchOverhead)
			}
			return skip + sent, t.reject(rest[sent], err)
		case partitionMates(try, f) == 1:
			limit = f
		default:
			mates := partitionMates(try, f)
			t.logger.Debug("Kafka refused a record batch: trying fewer records to find the record to blame", watermill.LogFields{
				"id": rest[sent+f].Metadata.Get(outbox.MetadataID), "records": mates, "err": err.Error(),
			})
			limit = f + max(1, mates/2)
		}
	}
	if bad != nil {
		return skip + len(records), t.reject(rest[len(records)], bad)
	}
	return len(batch), nil
}

// initProducer opens p's client, fences every earlier producer of its
// transactional id and reads what the outbox partition already committed
// to topic.
func (t *Target) initProducer(ctx context.Context, driver kafkadriver.Driver, p *producer, topic string, o origin.Origin) error {
	t.drop(p)
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return outbox.ErrClosed
	}
	txn, err := driver.Transactional(p.id)
	if err != nil {
		return err
	}
	// InitProducerId: from here on, the broker refuses the earlier owners.
	if err := txn.Init(ctx); err != nil {
		txn.Close()
		return fmt.Errorf("kafka: init the transactional producer %s: %w", p.id, err)
	}
	last, err := t.tailSeq(ctx, driver, topic, o)
	if kafkaseam.From(ctx).NoTailRead {
		last, err = 0, nil
	}
	if err != nil {
		txn.Close()
		return fmt.Errorf("kafka: read what outbox partition %s/%d already wrote to %s: %w", o.Topic, o.Partition, topic, err)
	}
	p.client.Store(&producerClient{txn: txn})
	p.topic, p.incarnation, p.token, p.lastSeq, p.ready = topic, o.Incarnation, o.Token, last, true
	t.logger.Debug("Transactional producer ready", watermill.LogFields{"transactional_id": p.id, "last_seq": last})
	return nil
}

// errCommitUnconfirmed: the client ended a transaction it was asked to
// commit without confirming a commit.
var errCommitUnconfirmed = errors.New("the Kafka client ended the transaction without confirming that the broker committed it (it may have aborted it); the next producer of the partition reads back what Kafka holds, and the rest is sent again")

// transact writes records in one Kafka transaction and commits it. On an
// error it returns the position in records of the first record that
// failed (-1: the error is not a record's). After any error the producer
// is dropped: the next transaction fences and reads the tail again. A
// transaction that failed before its commit is aborted first, so that
// read_committed consumers are not held up until its timeout.
func (t *Target) transact(ctx context.Context, p *producer, topic string, records []outRecord) (int, error) {
	cl := p.client.Load()
	if cl == nil || cl.txn == nil {
		return -1, outbox.ErrClosed
	}
	txn := cl.txn
	if err := txn.Begin(); err != nil {
		t.drop(p)
		return -1, fmt.Errorf("kafka: begin a transaction (%s): %w", p.id, err)
	}
	errs, finished := txn.Produce(ctx, kgoRecords(records))
	if !finished {
		t.drop(p) // records in flight: this client's transaction is lost
		return -1, fmt.Errorf("kafka: %s: %w", topic, errs[firstFailed(errs)])
	}
	if f := firstFailed(errs); f >= 0 {
		t.abort(ctx, p, txn)
		t.drop(p)
		return f, fmt.Errorf("kafka: %s: %w", topic, errs[f])
	}
	if hook := kafkaseam.From(ctx).BeforeCommit; hook != nil {
		hook()
	}
	committed, err := txn.End(ctx, true)
	if err != nil {
		t.drop(p)
		return -1, fmt.Errorf("kafka: commit the transaction (%s): %w", p.id, err)
	}
	if !committed {
		t.drop(p)
		t.logger.Info("A Kafka transaction's commit is not confirmed: reading back what Kafka holds before sending again", watermill.LogFields{"transactional_id": p.id})
		return -1, fmt.Errorf("kafka: commit the transaction (%s): %w", p.id, errCommitUnconfirmed)
	}
	return -1, nil
}

// abort ends a failed transaction at once, so that read_committed
// consumers are not held up until its timeout. When that fails, the next
// InitProducerId aborts the transaction anyway.
func (t *Target) abort(ctx context.Context, p *producer, txn kafkadriver.Transactional) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := txn.End(ctx, false); err != nil {
		t.logger.Debug("Could not abort the transaction (the next InitProducerId aborts it)", watermill.LogFields{"transactional_id": p.id, "err": err.Error()})
	}
}

// tailSeq returns the seq of the last record outbox partition o committed
// to topic (0: none found).
func (t *Target) tailSeq(ctx context.Context, driver kafkadriver.Driver, topic string, o origin.Origin) (int64, error) {
	offsets, err := driver.Offsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	n := len(offsets)
	if n == 0 {
		return 0, fmt.Errorf("topic %s has no partitions", topic)
	}
	scan := make([]int32, 0, n)
	if o.Partitions == n && t.defaultKey {
		// Equal counts: keyed records of outbox partition p are on Kafka
		// partition p (murmur2 in both), keyless ones too (Partitioner).
		scan = append(scan, int32(o.Partition))
	} else {
		for kp := range int32(n) {
			scan = append(scan, kp)
		}
	}
	var last int64
	for _, kp := range scan {
		off := offsets[kp]
		s, err := t.partitionTailSeq(ctx, driver, topic, kp, off.Start, off.End, o)
		if err != nil {
			return 0, err
		}
		last = max(last, s)
	}
	return last, nil
}

// partitionTailSeq reads Kafka partition kp of topic backwards from its
// end offset end, in windows that double, for the last committed record
// of o. It reads read_uncommitted, transaction markers included, and
// decides itself which records are committed: a transaction another
// producer keeps open (another source's, another outbox partition's with
// unequal partition counts; a zombie's lasts until its transaction
// timeout) holds a read_committed read back at the last stable offset,
// which would hide what o committed after it, and the tail read would
// send it again. o's own transactions have all ended: its producer was
// just fenced.
func (t *Target) partitionTailSeq(ctx context.Context, driver kafkadriver.Driver, topic string, kp int32, start, end int64, o origin.Origin) (int64, error) {
	var markers transactionMarkers
	step, scanned := int64(256), int64(0)
	for end > start {
		if scanned >= int64(t.cfg.TailScanLimit) {
			t.logger.Info("No record of the outbox partition in the scanned tail of the Kafka partition: if its last transaction is older, a message may be sent again (same outbox_id)", watermill.LogFields{
				"topic": topic, "kafka_partition": kp, "outbox_partition": o.Partition, "scanned": scanned,
			})
			return 0, nil
		}
		from := max(start, end-min(step, int64(t.cfg.TailScanLimit)-scanned))
		records, err := driver.ReadLog(ctx, topic, kp, from, end)
		if err != nil {
			return 0, err
		}
		// The markers of this window and of the later ones decide the
		// records of this window.
		markers.add(records)
		var last int64
		for _, r := range records {
			if r.Marker {
				continue
			}
			if s := recordSeq(r.Record, o); s > last && (!r.Transactional || markers.committed(r.ProducerID, r.Offset)) {
				last = s
			}
		}
		if last > 0 {
			return last, nil
		}
		scanned += end - from
		end, step = from, step*2
	}
	return 0, nil
}

// transactionMarkers are the transaction markers read so far of a Kafka
// partition, by producer id, in offset order.
type transactionMarkers map[int64][]marker

type marker struct {
	offset int64
	commit bool
}

// add notes the markers among records.
func (m *transactionMarkers) add(records []kafkadriver.LogRecord) {
	if *m == nil {
		*m = transactionMarkers{}
	}
	for _, r := range records {
		if r.Marker {
			(*m)[r.ProducerID] = append((*m)[r.ProducerID], marker{r.Offset, r.Commit})
		}
	}
	for pid, ms := range *m {
		slices.SortFunc(ms, func(a, b marker) int { return cmp.Compare(a.offset, b.offset) })
		(*m)[pid] = ms
	}
}

// committed reports whether the transactional record of producer pid at
// offset was committed: the first marker of pid after it commits.
func (m transactionMarkers) committed(pid, offset int64) bool {
	for _, mk := range m[pid] {
		if mk.offset > offset {
			return mk.commit
		}
	}
	return false // no marker yet: open (not this producer's: it was fenced)
}

// kgoRecords returns the kgo records of rs.
func kgoRecords(rs []outRecord) []*kgo.Record {
	out := make([]*kgo.Record, len(rs))
	for i, r := range rs {
		out[i] = r.record
	}
	return out
}

// recordSeq returns the outbox seq of r if it comes from the outbox
// partition of o (of the same source, and the same incarnation of its
// topic), else 0. A record without a source header comes from a forwarder
// without one.
func recordSeq(r *kgo.Record, o origin.Origin) int64 {
	var id, incarnation, source string
	for _, h := range r.Headers {
		switch h.Key {
		case outbox.MetadataID:
			id = string(h.Value)
		case outbox.MetadataIncarnation:
			incarnation = string(h.Value)
		case outbox.MetadataSource:
			source = string(h.Value)
		}
	}
	if id == "" || source != o.Source || (o.Incarnation != "" && incarnation != "" && incarnation != o.Incarnation) {
		return 0
	}
	// "topic/partition/seq", the topic may hold slashes.
	i := strings.LastIndexByte(id, '/')
	if i < 0 {
		return 0
	}
	j := strings.LastIndexByte(id[:i], '/')
	if j < 0 || id[:j] != o.Topic || id[j+1:i] != strconv.Itoa(o.Partition) {
		return 0
	}
	s, err := strconv.ParseInt(id[i+1:], 10, 64)
	if err != nil {
		return 0
	}
	return s
}
