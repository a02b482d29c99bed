package kafka

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/kafkaseam"
	"github.com/millrace/watermill-outbox/internal/origin"
)

// Taking a partition over: the producer started, the last writer fenced,
// the tail read back.

// isReady reports whether s's partition is taken over under s's lease for
// the producer's current start.
func (t *Target) isReady(s *txnSend) bool {
	st := t.txn.parts[t.key(s)]
	return t.txn.client.Load() != nil && st != nil && st.token == s.o.Token && st.incarnation == s.o.Incarnation && st.epoch == t.txn.epoch
}

// ready makes s's partition ready: the producer started, the partition
// taken over.
func (t *Target) ready(ctx context.Context, driver kafkadriver.Driver, s *txnSend) error {
	if t.isReady(s) {
		return nil
	}
	tp := t.txn
	k := t.key(s)
	if st := tp.parts[k]; st != nil && s.o.Token != 0 && s.o.Token < st.token {
		return errLeaseSuperseded
	}
	if tp.client.Load() == nil {
		if err := t.start(ctx, driver); err != nil {
			return err
		}
	}
	if err := t.takeOver(ctx, driver, s, k); err != nil {
		if permanentForTopic(err) {
			return err
		}
		return fmt.Errorf("kafka: take outbox partition %s/%d over for %s: %w", s.o.Topic, s.o.Partition, s.topic, err)
	}
	return nil
}

// start starts the producer: InitProducerId of its id, which fences its
// earlier starts and ends what they left open. Every partition is taken
// over again after it.
func (t *Target) start(ctx context.Context, driver kafkadriver.Driver) error {
	tp := t.txn
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return outbox.ErrClosed
	}
	txn, err := driver.Transactional(tp.id)
	if err != nil {
		return err
	}
	if err := txn.Init(ctx); err != nil {
		txn.Close()
		return fmt.Errorf("kafka: init the transactional producer %s: %w", tp.id, err)
	}
	tp.epoch++
	tp.client.Store(&producerClient{txn: txn})
	t.logger.Debug("Transactional producer started", watermill.LogFields{"transactional_id": tp.id, "start": tp.epoch})
	return nil
}

// takeOver takes s's partition over for the producer's current start:
// reads its writer record under s's lease (which checks the lease), fences
// that writer if it is another, records this producer as the writer, and
// reads what the partition already committed to the target topic.
func (t *Target) takeOver(ctx context.Context, driver kafkadriver.Driver, s *txnSend, k partKey) error {
	tp := t.txn
	rec := s.o.Writer
	if rec == nil {
		rec = tp.localRecord(k)
	}
	writer, known, err := rec.Writer(ctx)
	if err != nil {
		return err
	}
	prev := tp.parts[k]
	switch {
	case !known:
		if err := t.fence(ctx, driver, t.partitionTransactionalID(s.o)); err != nil {
			return err
		}
	case writer != "" && writer != tp.id:
		if err := t.fence(ctx, driver, writer); err != nil {
			return err
		}
	}
	if !known || writer != tp.id {
		if err := rec.SetWriter(ctx, tp.id); err != nil {
			return err
		}
	}
	var last int64
	if known && writer == tp.id && prev != nil && prev.epoch == tp.epoch {
		// This producer wrote the partition last, in this start, and knows
		// what it committed: its transactions of this start all ended
		// confirmed (one in doubt starts the producer again).
		last = prev.lastSeq
	} else if !kafkaseam.From(s.ctx).NoTailRead {
		if last, err = t.tailSeq(ctx, driver, s.topic, s.o); err != nil {
			return fmt.Errorf("read what it already wrote: %w", err)
		}
	}
	tp.parts[k] = &partState{token: s.o.Token, incarnation: s.o.Incarnation, epoch: tp.epoch, lastSeq: last}
	t.logger.Debug("Outbox partition taken over", watermill.LogFields{
		"transactional_id": tp.id, "topic": s.o.Topic, "partition": s.o.Partition, "fenced": writer, "last_seq": last,
	})
	return nil
}

// fence fences transactional id id: an InitProducerId of it bumps its
// epoch; the broker aborts what it left open (and waits for what it was
// ending) and refuses its writes from then on.
func (t *Target) fence(ctx context.Context, driver kafkadriver.Driver, id string) error {
	txn, err := driver.Transactional(id)
	if err != nil {
		return err
	}
	defer txn.Close()
	if err := txn.Init(ctx); err != nil {
		return fmt.Errorf("fence the transactional id %s: %w", id, err)
	}
	return nil
}

// localWriter is the writer record of a partition whose batches come
// without one (a target used without the outbox Subscriber): it lives as
// long as the target.
type localWriter struct {
	writer string
	known  bool
}

func (w *localWriter) Writer(context.Context) (string, bool, error) { return w.writer, w.known, nil }

func (w *localWriter) SetWriter(_ context.Context, writer string) error {
	w.writer, w.known = writer, true
	return nil
}

func (tp *txnProducer) localRecord(k partKey) *localWriter {
	if tp.local == nil {
		tp.local = map[partKey]*localWriter{}
	}
	w := tp.local[k]
	if w == nil {
		w = &localWriter{}
		tp.local[k] = w
	}
	return w
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
	var last int64
	for _, kp := range t.tailPartitions(o, n) {
		off := offsets[kp]
		s, err := t.partitionTailSeq(ctx, driver, topic, kp, off.Start, off.End, o)
		if err != nil {
			return 0, err
		}
		last = max(last, s)
	}
	return last, nil
}

// tailPartitions are the partitions of a target topic of n partitions
// that outbox partition o may have written to.
func (t *Target) tailPartitions(o origin.Origin, n int) []int32 {
	if o.Partitions == n && t.defaultKey {
		// Equal counts: keyed records of outbox partition p are on Kafka
		// partition p (murmur2 in both), keyless ones too (Partitioner).
		return []int32{int32(o.Partition)}
	}
	scan := make([]int32, 0, n)
	for kp := range int32(n) {
		scan = append(scan, kp)
	}
	return scan
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

var _ consumer.WriterRecord = (*localWriter)(nil)

// marker is a transaction marker read back: its offset, and whether it
// commits (or aborts) the producer's transaction.
type marker struct {
	offset int64
	commit bool
}
