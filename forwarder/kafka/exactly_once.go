package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/kafkaseam"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/origin"
)

// Exactly-once delivery into Kafka (the default of a Target).
//
// A target writes through one kgo transactional producer, transactional.id
// "<prefix>/<instance>" (a random instance id per Target), and sends the
// batches of every outbox partition it is given in rounds: a Send that
// finds no round in flight starts one at once, alone; the Sends that
// arrive while a round is in flight go together in the next one, one
// Kafka transaction for all their partitions. At light load a batch waits
// for nothing; under load the transactions grow with it.
//
// Three mechanisms keep it exactly once:
//
//   - Fencing the last writer. Each outbox partition's cursor row records
//     the transactional id that last wrote the partition into Kafka (its
//     writer, consumer.WriterRecord, read and set under the partition's
//     lease). When the target takes a partition over (the first batch of a
//     lease, or the first after its own producer started again), it reads
//     that record, fenced by the lease, and, when another id wrote last,
//     fences it with an InitProducerId of that id: the broker aborts what
//     that writer left open and refuses its writes from then on, whatever
//     partitions they were for. Only then does it record itself as the
//     writer. A writer is recorded only after the one before it was
//     fenced, so every id that ever wrote the partition is fenced or is
//     the recorded one. A row from before writer records (NULL) fences the
//     per-partition id the forwarders of earlier versions used.
//   - Checking its own leases after each start. The target's producer
//     starts (InitProducerId of its own id) before it reads any writer
//     record, and after each start it takes every partition over again
//     before it writes for it. A next owner records itself after it took
//     the lease and fences this id after that: a start of this producer
//     before that fence is fenced by it, one after it finds the lease
//     gone.
//   - Reading the tail. A previous writer may have committed its
//     transaction and died before the outbox cursor moved past the batch;
//     the cursor then hands the batch out again. So, after fencing, the
//     target reads the target partitions back, to the last committed record
//     of this outbox partition (partitionTailSeq says how it tells), and
//     skips the messages whose seq is at or below the seq it carries (header
//     outbox_id "topic/partition/seq", of the same topic incarnation and the
//     same source, header outbox_source). The InitProducerId before it
//     waits until the fenced transactions have ended, markers written.
//
// The target counts on nothing it has not seen. The records of a
// transaction are all acknowledged before it is ended; a commit counts
// only when the driver confirms the broker committed it (kgo's
// EndTransaction(TryCommit) returns nil also when it ended the
// transaction with an abort: see kafkadriver.Transactional.End), and a
// transaction without that confirmation is treated as not sent: the
// producer is dropped and started again, and the tail read of each
// partition says what Kafka holds. A batch is sent only under the lease
// (fencing token) it was delivered with: a partition that changed hands
// and came back is taken over again.
//
// When a round of several partitions fails, its transaction is aborted
// and each of its batches is sent again alone, where the target finds the
// record to blame (see Target).
//
// With equal partition counts (and the default Key), outbox partition p
// writes only to Kafka partition p, and the tail read is one short read.
// With unequal counts a partition's records spread over every Kafka
// partition, and the tail read scans each of them back until it finds a
// record of the outbox partition, at most TailScanLimit records each.

// partitionTransactionalID is the transactional id forwarders before the
// per-instance producer used for outbox partition o:
// "<prefix>/<schema>/<group>/<topic>/<partition>" ("<prefix>/source=<source>/…"
// with a source). A takeover of a partition whose writer is unknown fences
// it; at least once names its producers after it.
func (t *Target) partitionTransactionalID(o origin.Origin) string {
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

// newInstanceID returns a random instance id: 16 hex digits.
func newInstanceID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// txnProducer is a target's transactional producer and its rounds.
type txnProducer struct {
	id string

	*rounds // who runs the next round (rounds.go)

	client atomic.Pointer[producerClient] // nil: not started (read without a round by Close)

	// Owned by the round in flight (the lead's holder).
	epoch int64 // counts the starts of the producer
	parts map[partKey]*partState
	local map[partKey]*localWriter // writer records of batches without a lease's
}

// newTxnProducer returns the producer of transactional id id, not
// started.
func newTxnProducer(id string) *txnProducer {
	return &txnProducer{id: id, rounds: newRounds(), parts: map[partKey]*partState{}}
}

// partKey names an outbox partition and where it goes.
type partKey struct {
	source, schema, group, topic string
	partition                    int
	target                       string
}

// partState is what the producer knows of an outbox partition it took
// over.
type partState struct {
	token       int64
	incarnation string
	epoch       int64 // the start of the producer it was taken over for
	lastSeq     int64 // last outbox seq committed to Kafka
}

// txnSend is one Send in a round.
type txnSend struct {
	ctx   context.Context
	topic string
	batch []*message.Message
	o     origin.Origin

	lead     chan struct{} // closed: this send leads the next round
	finished chan struct{} // closed when done and err are set
	done     int
	err      error

	// Within a round.
	skip    int
	records []outRecord
	bad     error
}

func (t *Target) key(s *txnSend) partKey {
	return partKey{s.o.Source, s.o.Schema, s.o.Group, s.o.Topic, s.o.Partition, s.topic}
}

// sendExactlyOnce is Send with transactions; see the comment above.
func (t *Target) sendExactlyOnce(ctx context.Context, driver kafkadriver.Driver, from origin.Origin, topic string, batch []*message.Message) (int, error) {
	o, err := origin.Of(from, batch, "kafka")
	if err != nil {
		return 0, err
	}
	s := &txnSend{ctx: ctx, topic: topic, batch: batch, o: o, lead: make(chan struct{}), finished: make(chan struct{})}
	t.txn.run([]*txnSend{s}, true, t.linger, func(round []*txnSend) { t.round(driver, round) })
	return s.done, s.err
}

// linger waits Linger before a round takes the sends queued, so that more
// join it (cut short when the target closes).
func (t *Target) linger() {
	if t.cfg.Linger <= 0 {
		return
	}
	linger := time.NewTimer(t.cfg.Linger)
	defer linger.Stop()
	select {
	case <-linger.C:
	case <-t.life.Closing():
	}
}

// roundContext is the context of a round's calls: it ends at the latest
// deadline of its sends (none if one has none) or when the target closes,
// not when one send's context does: the other partitions' batches would
// fail with it.
func (t *Target) roundContext(round []*txnSend) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(round[0].ctx)
	var latest time.Time
	for _, s := range round {
		d, ok := s.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	cancel := context.CancelFunc(func() {})
	if !latest.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, latest)
	}
	ctx, cancelStop := context.WithCancel(ctx)
	go func() {
		select {
		case <-t.life.Closing():
			cancelStop()
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancelStop(); cancel() }
}

// round sends the batches of round: each one's partition taken over if it
// needs to be, what Kafka holds already skipped, the rest in one
// transaction; when that fails, each batch alone.
func (t *Target) round(driver kafkadriver.Driver, round []*txnSend) {
	ctx, cancel := t.roundContext(round)
	defer cancel()
	var hook func()
	for _, s := range round {
		if h := kafkaseam.From(s.ctx).BeforeCommit; h != nil {
			hook = h
		}
	}
	if len(round) == 1 {
		t.alone(ctx, driver, round[0], hook)
		return
	}
	var ready []*txnSend
	for _, s := range round {
		if s.ctx.Err() != nil {
			s.err = s.ctx.Err()
			continue
		}
		if err := t.prepare(ctx, driver, s); err != nil {
			s.err = err
			if permanentForTopic(err) {
				s.err = t.reject(s.batch[0], err)
			}
			continue
		}
		if len(s.records) > 0 {
			ready = append(ready, s)
		} else {
			t.settle(s, 0)
		}
	}
	switch len(ready) {
	case 0:
		return
	case 1:
		t.alone(ctx, driver, ready[0], hook)
		return
	}
	var records []outRecord
	for _, s := range ready {
		records = append(records, s.records...)
	}
	if _, err := t.transact(ctx, topicsOf(ready), records, hook); err == nil {
		if observe.Enabled() {
			observe.Current().KafkaTransaction(len(ready))
		}
		for _, s := range ready {
			t.committed(s, len(s.records))
			t.settle(s, len(s.records))
		}
		return
	}
	// The transaction is aborted (or in doubt: the producer starts again
	// and the tail reads say): each batch alone, which finds a record to
	// blame.
	for _, s := range ready {
		t.alone(ctx, driver, s, hook)
	}
}

// topicsOf names the target topics of sends, for errors.
func topicsOf(sends []*txnSend) string {
	var ts []string
	for _, s := range sends {
		if !slices.Contains(ts, s.topic) {
			ts = append(ts, s.topic)
		}
	}
	return strings.Join(ts, ",")
}

// prepare makes s's partition ready (taken over under its lease, for the
// producer's current start), skips what Kafka holds and builds the rest's
// records.
func (t *Target) prepare(ctx context.Context, driver kafkadriver.Driver, s *txnSend) error {
	if err := t.ready(ctx, driver, s); err != nil {
		return err
	}
	s.skip = t.skipCommitted(s, s.batch, 0)
	s.records, s.bad = t.build(ctx, s.topic, s.batch[s.skip:])
	return nil
}

// skipCommitted returns from, moved past the messages of batch[from:] that
// the partition already committed to Kafka.
func (t *Target) skipCommitted(s *txnSend, batch []*message.Message, from int) int {
	st := t.txn.parts[t.key(s)]
	n := from
	for n < len(batch) {
		seq, _ := origin.Seq(batch[n], "kafka") // checked by origin.Of
		if seq > st.lastSeq {
			break
		}
		n++
	}
	if n > from {
		t.logger.Info("Skipping messages Kafka already holds (a previous owner committed them and stopped before the outbox cursor moved)", watermill.LogFields{
			"transactional_id": t.txn.id, "from": batch[from].Metadata.Get(outbox.MetadataID), "skipped": n - from,
		})
	}
	return n
}

// committed notes that the first n records of s are committed.
func (t *Target) committed(s *txnSend, n int) {
	if n == 0 {
		return
	}
	seq, _ := origin.Seq(s.batch[s.skip+s.records[n-1].index], "kafka")
	t.txn.parts[t.key(s)].lastSeq = seq
}

// settle sets s's result once all its records are committed: the whole
// batch, or up to the message that cannot be sent, rejected.
func (t *Target) settle(s *txnSend, n int) {
	s.done = s.skip + n
	if s.bad != nil {
		s.err = t.reject(s.batch[s.skip+n], s.bad)
		return
	}
	s.done = len(s.batch)
}

// alone sends s in transactions of its own. When the broker refuses a
// record batch of several records for their size or one invalid record,
// the next transactions hold fewer records until the record to blame is
// first in line and alone: it is rejected on its first attempt and the
// records before it are delivered, within this Send.
func (t *Target) alone(ctx context.Context, driver kafkadriver.Driver, s *txnSend, hook func()) {
	s.done, s.err = t.sendAlone(ctx, driver, s, hook)
}

func (t *Target) sendAlone(ctx context.Context, driver kafkadriver.Driver, s *txnSend, hook func()) (int, error) {
	if err := t.prepare(ctx, driver, s); err != nil {
		if permanentForTopic(err) {
			return 0, t.reject(s.batch[0], err)
		}
		return 0, err
	}
	rest := s.batch[s.skip:]
	if len(rest) == 0 {
		return len(s.batch), nil
	}
	records := s.records
	sent, limit := 0, len(records)
	for sent < len(records) {
		if !t.isReady(s) {
			if err := t.ready(ctx, driver, s); err != nil {
				return s.skip + sent, err
			}
			// What the failed transaction left may have been committed
			// after all (a commit whose answer was lost): the tail says.
			sent = t.skipCommitted(s, rest, sent)
			if sent == len(records) {
				break
			}
		}
		end := min(len(records), sent+limit)
		try := records[sent:end]
		f, err := t.transact(ctx, s.topic, try, hook)
		if err == nil {
			if observe.Enabled() {
				observe.Current().KafkaTransaction(1)
			}
			seq, _ := origin.Seq(rest[end-1], "kafka")
			t.txn.parts[t.key(s)].lastSeq = seq
			sent = end
			continue
		}
		switch {
		case f < 0 || ctx.Err() != nil || s.ctx.Err() != nil:
			return s.skip + sent, err
		case permanentForTopic(err) && f == 0:
			return s.skip + sent, t.reject(rest[sent], err)
		case permanentForTopic(err):
			limit = f // deliver the records before it, then it alone
		case !refusedForItsRecords(err):
			return s.skip + sent, err
		case partitionMates(try, f) == 1 && f == 0:
			if refusedForSize(err) && !t.compressed() {
				t.noteRefused(s.topic, try[0].size+recordBatchOverhead)
			}
			return s.skip + sent, t.reject(rest[sent], err)
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
	if s.bad != nil {
		return s.skip + len(records), t.reject(rest[len(records)], s.bad)
	}
	return len(s.batch), nil
}

// errLeaseSuperseded: a batch of an older lease than one the target took
// the partition over with.
var errLeaseSuperseded = errors.New("kafka: the batch was delivered under an older lease of its partition than one the target already sends for: it is not sent")

// errCommitUnconfirmed: the client ended a transaction it was asked to
// commit without confirming a commit.
var errCommitUnconfirmed = errors.New("the Kafka client ended the transaction without confirming that the broker committed it (it may have aborted it); the producer starts again, each partition's tail read says what Kafka holds, and the rest is sent again")

// transact writes records in one Kafka transaction and commits it. On an
// error it returns the position in records of the first record that
// failed (-1: the error is not a record's). After any error the producer
// is dropped: it starts again, and every partition is taken over again,
// before the next transaction. A transaction that failed before its
// commit is aborted first, so that read_committed consumers are not held
// up until its timeout.
func (t *Target) transact(ctx context.Context, topic string, records []outRecord, hook func()) (int, error) {
	tp := t.txn
	cl := tp.client.Load()
	if cl == nil || cl.txn == nil {
		return -1, outbox.ErrClosed
	}
	txn := cl.txn
	if err := txn.Begin(); err != nil {
		t.dropTxn()
		return -1, fmt.Errorf("kafka: begin a transaction (%s): %w", tp.id, err)
	}
	errs, finished := txn.Produce(ctx, kgoRecords(records))
	if !finished {
		t.dropTxn() // records in flight: this client's transaction is lost
		return -1, fmt.Errorf("kafka: %s: %w", topic, errs[firstFailed(errs)])
	}
	if f := firstFailed(errs); f >= 0 {
		t.abort(ctx, txn)
		t.dropTxn()
		return f, fmt.Errorf("kafka: %s: %w", topic, errs[f])
	}
	if hook != nil {
		hook()
	}
	committed, err := txn.End(ctx, true)
	if err != nil {
		t.dropTxn()
		return -1, fmt.Errorf("kafka: commit the transaction (%s): %w", tp.id, err)
	}
	if !committed {
		t.dropTxn()
		t.logger.Info("A Kafka transaction's commit is not confirmed: reading back what Kafka holds before sending again", watermill.LogFields{"transactional_id": tp.id})
		return -1, fmt.Errorf("kafka: commit the transaction (%s): %w", tp.id, errCommitUnconfirmed)
	}
	return -1, nil
}

// dropTxn forgets the producer's client after a failure that leaves it in
// doubt (closed in the background: closing waits for nothing the send
// needs); the next transaction starts the producer again.
func (t *Target) dropTxn() {
	if cl := t.txn.client.Swap(nil); cl != nil {
		t.closeLater(cl)
	}
}

// abort ends a failed transaction at once, so that read_committed
// consumers are not held up until its timeout. When that fails, the next
// InitProducerId aborts the transaction anyway.
func (t *Target) abort(ctx context.Context, txn kafkadriver.Transactional) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := txn.End(ctx, false); err != nil {
		t.logger.Debug("Could not abort the transaction (the next InitProducerId aborts it)", watermill.LogFields{"transactional_id": t.txn.id, "err": err.Error()})
	}
}

// kgoRecords returns the kgo records of rs.
func kgoRecords(rs []outRecord) []*kgo.Record {
	out := make([]*kgo.Record, len(rs))
	for i, r := range rs {
		out[i] = r.record
	}
	return out
}
