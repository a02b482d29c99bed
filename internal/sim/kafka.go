package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/internal/kafkadriver"
)

// The Kafka model: topics of partitions holding records and transaction
// markers, transactional ids with producer ids and epochs, and the
// transaction coordinator's rules as the target depends on them (KIP-890
// part 2, as franz-go and kfake run it):
//
//   - InitProducerId bumps the id's epoch and aborts a transaction the
//     previous epoch left open (a marker in each of its partitions): from
//     then on every produce of an older epoch is refused
//     (INVALID_PRODUCER_EPOCH), every EndTxn too (PRODUCER_FENCED);
//   - a produce registers its partition in the id's transaction, begun
//     implicitly by the first one; EndTxn commits or aborts it, writes a
//     marker in each of its partitions and bumps the epoch;
//   - a read_committed consumer reads up to the last stable offset (the
//     first offset of a transaction still open) and skips the records of
//     aborted transactions;
//   - a record batch larger than max.message.bytes is refused
//     (MESSAGE_TOO_LARGE), with the records after it in its partition.
//
// The client side (the driver, kafkadriver.Transactional) is kgo's: the
// records a produce hands over are batched per partition, an answer can be
// lost (the scheduler decides), and EndTxn(commit) can end the transaction
// with an abort and return nil when the client believes nothing was added
// to the transaction — franz-go's behaviour; the driver then reports it
// not committed, as the product's kgo driver does when it sees no commit
// answer (internal/kafkadriver).

// kafka is the cluster's state.
type kafka struct {
	maxMessageBytes int
	// batchBytes is the client's ProducerBatchMaxBytes (the target's
	// MaxBatchBytes): the records of a produce for one partition go in
	// record batches of at most this.
	batchBytes  int
	partitioner kgo.Partitioner
	topics      map[string][]*kpartition
	ids         map[string]*txnID
	nextPID     int64
	// down: every request fails (a broker outage).
	down bool
	// now is the clock, txnTimeout the transaction timeout: the
	// coordinator aborts a transaction open longer (and bumps the epoch).
	now        func() time.Time
	txnTimeout time.Duration
	// kfakeOrder: a produce registers its partition in the transaction
	// before the epoch is checked, as kfake does (a refused produce of a
	// fenced producer leaves an empty transaction open); a real broker
	// checks the epoch first. The pinning tests set it to compare with
	// kfake.
	kfakeOrder bool
	// inits counts each transactional id's InitProducerId calls.
	inits map[string]int
}

// kpartition is a partition's log.
type kpartition struct {
	records []krecord
}

// krecord is a record or a transaction marker.
type krecord struct {
	offset  int64
	key     []byte
	value   []byte
	headers []kgo.RecordHeader
	txn     *txn // nil: not transactional
	pid     int64
	marker  bool // a control record (commit or abort marker)
	commit  bool // a commit marker
}

// header returns the value of the record's header key ("" when absent).
func (r krecord) header(key string) string {
	for _, h := range r.headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// txn is one transaction of a transactional id.
type txn struct {
	id      string
	pid     int64
	epoch   int16
	state   txnState
	parts   map[topicPartition]bool
	started time.Time
}

type txnState int

const (
	ongoing txnState = iota
	committed
	aborted
)

type topicPartition struct {
	topic     string
	partition int32
}

// txnID is a transactional id's coordinator state.
type txnID struct {
	pid   int64
	epoch int16
	cur   *txn // open transaction, nil for none
	// fencedOpen is the epoch whose open transaction the last
	// InitProducerId aborted (-1: none).
	fencedOpen int16
}

func newKafka(now func() time.Time, txnTimeout time.Duration, maxMessageBytes, batchBytes int, partitioner kgo.Partitioner) *kafka {
	return &kafka{now: now, txnTimeout: txnTimeout, maxMessageBytes: maxMessageBytes, batchBytes: batchBytes, partitioner: partitioner,
		topics: map[string][]*kpartition{}, ids: map[string]*txnID{}, nextPID: 1000, inits: map[string]int{}}
}

// expire aborts the transactions open longer than the transaction
// timeout, as the coordinator does, bumping their ids' epochs.
func (k *kafka) expire() {
	ids := make([]string, 0, len(k.ids))
	for id := range k.ids {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		st := k.ids[id]
		if st.cur != nil && !k.now().Before(st.cur.started.Add(k.txnTimeout)) {
			k.end(st.cur, false)
			st.cur = nil
			st.epoch++
		}
	}
}

// begin opens a transaction of st.
func (k *kafka) begin(id string, st *txnID) *txn {
	st.cur = &txn{id: id, pid: st.pid, epoch: st.epoch, parts: map[topicPartition]bool{}, started: k.now()}
	return st.cur
}

func (k *kafka) createTopic(name string, partitions int) {
	ps := make([]*kpartition, partitions)
	for i := range ps {
		ps[i] = &kpartition{}
	}
	k.topics[name] = ps
}

// append adds a record or marker.
func (p *kpartition) append(r krecord) int64 {
	r.offset = int64(len(p.records))
	p.records = append(p.records, r)
	return r.offset
}

// end ends t: commit or abort, a marker in each of its partitions.
func (k *kafka) end(t *txn, commit bool) {
	t.state = aborted
	if commit {
		t.state = committed
	}
	for _, tp := range sortedTopicPartitions(t.parts) {
		k.topics[tp.topic][tp.partition].append(krecord{txn: t, pid: t.pid, marker: true, commit: commit})
	}
}

// init is InitProducerId for id: a new epoch, and the open transaction of
// the previous one aborted.
func (k *kafka) init(id string) (int64, int16) {
	k.inits[id]++
	st := k.ids[id]
	if st == nil {
		st = &txnID{pid: k.nextPID, epoch: -1, fencedOpen: -1}
		k.nextPID++
		k.ids[id] = st
	}
	st.fencedOpen = -1
	if st.cur != nil {
		st.fencedOpen = st.cur.epoch
		k.end(st.cur, false)
		st.cur = nil
	}
	st.epoch++
	return st.pid, st.epoch
}

// committedRecords returns the data records of [from, end) of a partition
// a read_committed consumer reads.
func (p *kpartition) committedRecords(from, end int64) []krecord {
	var out []krecord
	for _, r := range p.records {
		if r.offset < from || r.offset >= end || r.marker {
			continue
		}
		if r.txn != nil && r.txn.state != committed {
			continue
		}
		out = append(out, r)
	}
	return out
}

// kafkaDriver is a process's Kafka client on the model: it implements
// kafkadriver.Driver. Every request parks the process.
type kafkaDriver struct {
	k *kafka
	p *proc
	// convertCommit, when it returns true, makes an EndTxn asked to
	// commit end the transaction with an abort and report nil — kgo's
	// behaviour when it believes no partition was added (the scheduler
	// draws it).
	convertCommit func() bool
	// trustEnd reports a transaction committed whenever EndTxn was asked
	// to commit and returned nil, as the Kafka driver did before it
	// checked the broker's answer (Options.TrustEndTxn).
	trustEnd bool
}

var _ kafkadriver.Driver = (*kafkaDriver)(nil)

// errBrokerDown is what a request gets during an outage.
var errBrokerDown = errors.New("sim: kafka: unable to dial: connection refused")

// request parks the process at a Kafka request op; it returns the
// scheduler's outcome, and an error when the request does not take effect.
func (d *kafkaDriver) request(ctx context.Context, op string) (outcome, error) {
	o := answered
	if d.p != nil {
		o = d.p.enter(roleOf(ctx, "kafka"), op, nil)
	}
	if !o.applies() {
		return o, fmt.Errorf("%s: %w", op, errConnection)
	}
	if d.k.down {
		return failBefore, errBrokerDown
	}
	return o, nil
}

// detail is the op with details when the schedule is traced.
func (d *kafkaDriver) detail(op, format string, args ...any) string {
	if d.p == nil {
		return op
	}
	return d.p.s.detail(op, format, args...)
}

func (d *kafkaDriver) Compressed() bool { return false }
func (d *kafkaDriver) Close()           {}

func (d *kafkaDriver) TopicPartitions(_ context.Context, topic string) (int, bool, error) {
	ps, ok := d.k.topics[topic]
	return len(ps), ok, nil
}

func (d *kafkaDriver) CreateTopic(context.Context, string, int) error {
	return fmt.Errorf("sim: topics are made by the world: %w", kerr.TopicAuthorizationFailed)
}

func (d *kafkaDriver) Offsets(ctx context.Context, topic string) (map[int32]kafkadriver.PartitionOffsets, error) {
	o, err := d.request(ctx, "kafka.list_offsets")
	if err != nil {
		return nil, err
	}
	ps, ok := d.k.topics[topic]
	if !ok {
		return nil, kerr.UnknownTopicOrPartition
	}
	out := make(map[int32]kafkadriver.PartitionOffsets, len(ps))
	for i, p := range ps {
		out[int32(i)] = kafkadriver.PartitionOffsets{Start: 0, End: int64(len(p.records))}
	}
	if o.fails() {
		return nil, errConnection
	}
	return out, nil
}

func (d *kafkaDriver) ReadLog(ctx context.Context, topic string, partition int32, from, end int64) ([]kafkadriver.LogRecord, error) {
	o, err := d.request(ctx, d.detail("kafka.fetch", "%s/%d [%d, %d)", topic, partition, from, end))
	if err != nil {
		return nil, err
	}
	ps, ok := d.k.topics[topic]
	if !ok || int(partition) >= len(ps) {
		return nil, kerr.UnknownTopicOrPartition
	}
	var out []kafkadriver.LogRecord
	for _, r := range ps[partition].records {
		if r.offset < from || r.offset >= end {
			continue
		}
		out = append(out, kafkadriver.LogRecord{
			Record:        &kgo.Record{Topic: topic, Partition: partition, Offset: r.offset, Key: r.key, Value: r.value, Headers: r.headers, ProducerID: r.pid},
			Transactional: r.txn != nil, Marker: r.marker, Commit: r.commit,
		})
	}
	if o.fails() {
		return nil, errConnection
	}
	return out, nil
}

func (d *kafkaDriver) Transactional(id string) (kafkadriver.Transactional, error) {
	return &kafkaProducer{d: d, id: id, epoch: -1}, nil
}

func (d *kafkaDriver) Idempotent() (kafkadriver.Idempotent, error) {
	return nil, fmt.Errorf("sim: at-least-once delivery: %w", errNotSimulated)
}

// kafkaProducer is a transactional producer (kgo's, as the model sees it).
type kafkaProducer struct {
	d     *kafkaDriver
	id    string
	pid   int64
	epoch int16 // -1: not initialised (or the answer that bumped it was lost)
	inTxn bool
	// produced: records were handed over in this transaction; added:
	// one of them was written (a partition joined the transaction).
	produced, added bool
	closed          bool
}

func (p *kafkaProducer) Init(ctx context.Context) error {
	o, err := p.d.request(ctx, "kafka.init_producer_id "+p.id) // the id always: scenarios wait for a fence of a given one
	if err != nil {
		return err
	}
	pid, epoch := p.d.k.init(p.id)
	if o.fails() {
		p.epoch = -1
		return errConnection
	}
	p.pid, p.epoch = pid, epoch
	return nil
}

func (p *kafkaProducer) Begin() error {
	if p.inTxn {
		return errors.New("invalid attempt to begin a transaction while already in a transaction")
	}
	if p.epoch < 0 {
		return errors.New("sim: kafka: producer id not initialised")
	}
	p.inTxn, p.produced, p.added = true, false, false
	return nil
}

// recordSize is a record's size in a record batch (as the target bounds
// it).
func recordSize(r *kgo.Record) int {
	n := 36 + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 10
	}
	return n
}

func (p *kafkaProducer) Produce(ctx context.Context, records []*kgo.Record) ([]error, bool) {
	errs := make([]error, len(records))
	if !p.inTxn {
		for i := range errs {
			errs[i] = errors.New("cannot produce to a transactional producer outside a transaction")
		}
		return errs, true
	}
	p.produced = true
	o, err := p.d.request(ctx, p.d.detail("kafka.produce", "%s: %d records from %s", p.id, len(records), idOf(records[0])))
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs, !o.kills()
	}
	k := p.d.k
	st := k.ids[p.id]
	// Group the records by partition, in order, as kgo does.
	type part struct {
		tp      topicPartition
		indexes []int
	}
	var parts []*part
	byTP := map[topicPartition]*part{}
	for i, r := range records {
		ps := k.topics[r.Topic]
		if ps == nil {
			errs[i] = kerr.UnknownTopicOrPartition
			continue
		}
		r.Partition = int32(k.partitioner.ForTopic(r.Topic).Partition(r, len(ps)))
		tp := topicPartition{r.Topic, r.Partition}
		pt := byTP[tp]
		if pt == nil {
			pt = &part{tp: tp}
			byTP[tp] = pt
			parts = append(parts, pt)
		}
		pt.indexes = append(pt.indexes, i)
	}
	for _, pt := range parts {
		fenced := st == nil || st.pid != p.pid || st.epoch != p.epoch
		if fenced {
			if k.kfakeOrder && st != nil && st.pid == p.pid {
				// kfake: the partition joins the id's transaction (one
				// begins) before the epoch is checked.
				if st.cur == nil {
					k.begin(p.id, st)
				}
				st.cur.parts[pt.tp] = true
			}
			for _, i := range pt.indexes {
				errs[i] = kerr.InvalidProducerEpoch
			}
			continue
		}
		if st.cur == nil {
			k.begin(p.id, st)
		}
		// Record batches of at most batchBytes; one larger than the
		// broker's max message size is refused, with every record after
		// it in the partition.
		var failed error
		for start := 0; start < len(pt.indexes); {
			end, size := start, 61
			for end < len(pt.indexes) && (end == start || size+recordSize(records[pt.indexes[end]]) <= k.batchBytes) {
				size += recordSize(records[pt.indexes[end]])
				end++
			}
			if failed == nil && size > k.maxMessageBytes {
				failed = kerr.MessageTooLarge
			}
			for _, i := range pt.indexes[start:end] {
				if failed != nil {
					errs[i] = failed
					continue
				}
				r := records[i]
				st.cur.parts[pt.tp] = true
				r.Offset = k.topics[pt.tp.topic][pt.tp.partition].append(krecord{key: r.Key, value: r.Value, headers: r.Headers, txn: st.cur, pid: st.pid})
				p.added = true
			}
			start = end
		}
	}
	if o.fails() {
		// Written (or refused) as above, but no answer: kgo waits for it
		// until the send's context ends.
		for i := range errs {
			errs[i] = fmt.Errorf("no answer in time: %w", context.DeadlineExceeded)
		}
		return errs, false
	}
	return errs, true
}

func (p *kafkaProducer) End(ctx context.Context, commit bool) (bool, error) {
	if !p.inTxn {
		return false, nil
	}
	p.inTxn = false
	if !p.produced {
		return false, nil // nothing began: nothing is sent
	}
	asked := commit
	if !p.added || (commit && p.d.convertCommit != nil && p.d.convertCommit()) {
		// kgo: no partition was added (as it believes): it aborts to clear
		// any server-side registration, whatever was asked, and returns
		// nil.
		commit = false
	}
	o, err := p.d.request(ctx, p.d.detail("kafka.end_txn", "%s commit %v", p.id, commit))
	if err != nil {
		p.epoch = -1
		return false, err
	}
	k := p.d.k
	st := k.ids[p.id]
	if st == nil || st.pid != p.pid || st.epoch != p.epoch {
		if o.fails() {
			return false, errConnection
		}
		if st != nil && st.pid == p.pid && st.epoch == p.epoch+1 && st.fencedOpen == p.epoch {
			// The producer's open transaction was aborted by the
			// InitProducerId that fenced it: its commit, at the epoch just
			// before the current one, passes the check of an EndTxn retry
			// (KIP-890 part 2) and fails the state check:
			// INVALID_TXN_STATE (kfake, and Kafka before KAFKA-20785, which
			// answers PRODUCER_FENCED).
			return false, kerr.InvalidTxnState
		}
		return false, kerr.ProducerFenced
	}
	if st.cur != nil {
		k.end(st.cur, commit)
		st.cur = nil
	}
	st.epoch++ // EndTxn v5 bumps the epoch
	if o.fails() {
		p.epoch = -1 // kgo fails the producer id: the next use re-inits
		return false, errConnection
	}
	p.epoch = st.epoch
	if p.d.trustEnd {
		return asked, nil
	}
	return commit, nil
}

func (p *kafkaProducer) Close() { p.closed = true }

// sortedTopicPartitions returns the keys of m in order.
func sortedTopicPartitions(m map[topicPartition]bool) []topicPartition {
	out := make([]topicPartition, 0, len(m))
	for tp := range m {
		out = append(out, tp)
	}
	sortStable(out, func(a, b topicPartition) bool {
		if a.topic != b.topic {
			return a.topic < b.topic
		}
		return a.partition < b.partition
	})
	return out
}

// idOf is a record's outbox_id, for the trace.
func idOf(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == "outbox_id" {
			return string(h.Value)
		}
	}
	return "?"
}
