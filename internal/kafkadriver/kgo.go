package kafkadriver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Options returns the options of one of a driver's clients: the target's
// defaults and settings, then extra, what that client needs.
type Options func(extra []kgo.Opt) []kgo.Opt

// newClientMu serializes the making of clients: kgo.NewClient writes into
// the codec slice of a kgo.ProducerBatchCompression option, which the
// options of every client of a target share.
var newClientMu sync.Mutex

// NewClient makes a kgo client of opts (serialized with the others).
func NewClient(opts []kgo.Opt) (*kgo.Client, error) {
	newClientMu.Lock()
	defer newClientMu.Unlock()
	return kgo.NewClient(opts...)
}

// NewKgo returns the driver of franz-go's kgo: a shared client for the
// admin requests, a client per producer, a read_committed consumer per
// range read. It makes the shared client, which connects when first used.
// opts gives every client's options; transactional the options a
// transactional producer adds (kgo.TransactionalID and the target's
// transaction settings).
func NewKgo(opts Options, transactional func(id string) []kgo.Opt) (Driver, error) {
	shared, err := NewClient(opts(nil))
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	d := &kgoDriver{opts: opts, transactional: transactional, shared: shared, admin: kadm.NewClient(shared)}
	// The broker judges compressed sizes: with compression, a record as
	// large as one it refused may still fit.
	if codecs, ok := shared.OptValue(kgo.ProducerBatchCompression).([]kgo.CompressionCodec); ok && len(codecs) > 0 {
		d.compressed = codecs[0] != kgo.NoCompression()
	}
	// A transactional producer watches its client's log lines for the
	// commit (see watchLogger); the user's logger, if any, still gets
	// every line at its level.
	d.userLogger, _ = shared.OptValue(kgo.WithLogger).(kgo.Logger)
	return d, nil
}

type kgoDriver struct {
	opts          Options
	transactional func(id string) []kgo.Opt
	shared        *kgo.Client
	admin         *kadm.Client
	compressed    bool
	userLogger    kgo.Logger
}

func (d *kgoDriver) Compressed() bool { return d.compressed }

func (d *kgoDriver) Close() { d.shared.Close() }

func (d *kgoDriver) TopicPartitions(ctx context.Context, topic string) (int, bool, error) {
	details, err := d.admin.ListTopics(ctx, topic)
	if err != nil {
		return 0, false, err
	}
	t, found := details[topic]
	if !found || errors.Is(t.Err, kerr.UnknownTopicOrPartition) {
		return 0, false, nil
	}
	if t.Err != nil {
		return 0, false, t.Err
	}
	return len(t.Partitions), true, nil
}

func (d *kgoDriver) CreateTopic(ctx context.Context, topic string, partitions int) error {
	resp, err := d.admin.CreateTopic(ctx, int32(partitions), -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	return err
}

func (d *kgoDriver) Offsets(ctx context.Context, topic string) (map[int32]PartitionOffsets, error) {
	starts, err := d.admin.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("start offsets: %w", err)
	}
	// read_uncommitted: the high watermarks.
	ends, err := d.admin.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("end offsets: %w", err)
	}
	out := make(map[int32]PartitionOffsets, len(ends[topic]))
	for p, end := range ends[topic] {
		start, _ := starts.Lookup(topic, p)
		out[p] = PartitionOffsets{Start: start.Offset, End: end.Offset}
	}
	return out, nil
}

// idleRead is how long a range read waits, once the broker served some of
// the range, for more before it takes the range as read: a record the
// range ends with may be gone (compaction), and nothing else shows that
// the read got there.
const idleRead = time.Second

// batchesRead counts the record batches a consumer decoded
// (kgo.HookFetchBatchRead): the broker is serving the range.
type batchesRead struct{ n atomic.Int64 }

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (b *batchesRead) OnFetchBatchRead(kgo.BrokerMetadata, string, int32, kgo.FetchBatchMetrics) {
	b.n.Add(1)
}

// ReadLog reads [from, end) through a read_uncommitted kgo consumer of its
// own that keeps the control records (the transaction markers).
func (d *kgoDriver) ReadLog(ctx context.Context, topic string, partition int32, from, end int64) ([]LogRecord, error) {
	if end <= from {
		return nil, nil
	}
	read := &batchesRead{}
	cl, err := NewClient(d.opts([]kgo.Opt{
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.WithHooks(read),
	}))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []LogRecord
	batches, changed := int64(0), time.Now()
	for {
		pctx, cancel := context.WithTimeout(ctx, idleRead/4)
		fetches := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, context.Cause(ctx)
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && ferr == nil {
				ferr = err
			}
		})
		if ferr != nil {
			return nil, fmt.Errorf("read partition %d from offset %d: %w", partition, from, ferr)
		}
		done := false
		var derr error
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end-1 {
				done = true
			}
			if r.Offset >= end || r.Offset < from {
				return
			}
			lr := LogRecord{Record: r, Transactional: r.Attrs.IsTransactional()}
			if r.Attrs.IsControl() {
				var key kmsg.ControlRecordKey
				if err := key.ReadFrom(r.Key); err != nil {
					derr = fmt.Errorf("partition %d offset %d: a control record whose key does not decode: %w", partition, r.Offset, err)
					return
				}
				switch key.Type {
				case kmsg.ControlRecordKeyTypeAbort, kmsg.ControlRecordKeyTypeCommit:
					lr.Marker, lr.Commit = true, key.Type == kmsg.ControlRecordKeyTypeCommit
				default:
					return // not a transaction marker
				}
			}
			out = append(out, lr)
		})
		if derr != nil {
			return nil, derr
		}
		if done {
			return out, nil
		}
		if n := read.n.Load(); n != batches {
			batches, changed = n, time.Now()
		} else if batches > 0 && time.Since(changed) >= idleRead {
			return out, nil
		}
	}
}

func (d *kgoDriver) Transactional(id string) (Transactional, error) {
	w := &watchLogger{user: d.userLogger}
	cl, err := NewClient(d.opts(append(d.transactional(id), kgo.WithLogger(w))))
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	return &kgoTransactional{id: id, cl: cl, watch: w}, nil
}

func (d *kgoDriver) Idempotent() (Idempotent, error) {
	cl, err := NewClient(d.opts([]kgo.Opt{
		kgo.AllowIdempotentProduceCancellation(),
		kgo.ManualFlushing(),
		// Manual flushing refuses a record past a buffer limit. Counting
		// records only, a try below the limit never meets it; a limit in
		// bytes could refuse one record and take the next, smaller one.
		kgo.MaxBufferedBytes(0),
	}))
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	capacity := 10000 // kgo's default
	if n, ok := cl.OptValue(kgo.MaxBufferedRecords).(int64); ok && n > 0 {
		capacity = int(n)
	}
	return &kgoIdempotent{cl: cl, capacity: capacity}, nil
}

type kgoTransactional struct {
	id    string
	cl    *kgo.Client
	watch *watchLogger
}

func (p *kgoTransactional) Init(ctx context.Context) error {
	_, _, err := p.cl.ProducerID(ctx)
	return err
}

func (p *kgoTransactional) Begin() error { return p.cl.BeginTransaction() }

func (p *kgoTransactional) Produce(ctx context.Context, records []*kgo.Record) ([]error, bool) {
	return produce(ctx, p.cl, records, false)
}

// End ends the transaction with kgo's EndTransaction. A commit counts as
// committed only when the client logged the broker's answer to an EndTxn
// that committed: EndTransaction(TryCommit) returns nil also when it ended
// the transaction with an abort (franz-go v1.22: a transaction in which it
// believes no partition was added is aborted, whatever the caller asked)
// or sent nothing at all.
func (p *kgoTransactional) End(ctx context.Context, commit bool) (bool, error) {
	p.watch.committed.Store(false)
	try := kgo.TryAbort
	if commit {
		try = kgo.TryCommit
	}
	if err := p.cl.EndTransaction(ctx, try); err != nil {
		return false, err
	}
	return commit && p.watch.committed.Load(), nil
}

func (p *kgoTransactional) Close() { p.cl.Close() }

type kgoIdempotent struct {
	cl       *kgo.Client
	capacity int
}

func (p *kgoIdempotent) Capacity() int { return p.capacity }

func (p *kgoIdempotent) ProduceFlush(ctx context.Context, records []*kgo.Record) ([]error, bool) {
	return produce(ctx, p.cl, records, true)
}

func (p *kgoIdempotent) Close() { p.cl.Close() }

// commitAnswered is the line kgo logs (at info) when the broker answered an
// EndTxn, with its "commit" value: what the request asked.
const commitAnswered = "end transaction response successfully received"

// watchLogger is a transactional client's logger: it notes the broker's
// answer to a committing EndTxn, and passes every line on to the user's
// logger (kgo.WithLogger in the client options), at that logger's level.
type watchLogger struct {
	user      kgo.Logger
	committed atomic.Bool
}

// Level implements kgo.Logger: info at least, where the EndTxn answer is.
func (w *watchLogger) Level() kgo.LogLevel {
	if w.user != nil && w.user.Level() > kgo.LogLevelInfo {
		return w.user.Level()
	}
	return kgo.LogLevelInfo
}

// Log implements kgo.Logger.
func (w *watchLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if msg == commitAnswered {
		for i := 0; i+1 < len(keyvals); i += 2 {
			if k, _ := keyvals[i].(string); k != "commit" {
				continue
			}
			switch v := keyvals[i+1].(type) {
			case kgo.TransactionEndTry:
				w.committed.Store(bool(v))
			case bool:
				w.committed.Store(v)
			}
		}
	}
	if w.user != nil && level <= w.user.Level() {
		w.user.Log(level, msg, keyvals...)
	}
}

// produce hands records to cl and waits until kgo finished each of them,
// or ctx ends. It returns each record's error (nil: stored), and whether
// every record finished (false: ctx ended first; the unfinished ones have
// ctx's error and may still be stored). With flush, cl flushes manually
// (kgo.ManualFlushing): produce flushes once every record is handed over.
func produce(ctx context.Context, cl *kgo.Client, records []*kgo.Record, flush bool) ([]error, bool) {
	if len(records) == 0 {
		return nil, true
	}
	var mu sync.Mutex
	errs := make([]error, len(records))
	finished := make([]bool, len(records))
	left := len(records)
	all := make(chan struct{})
	for i, r := range records {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			errs[i], finished[i] = err, true
			if left--; left == 0 {
				close(all)
			}
		})
	}
	if flush {
		_ = cl.Flush(ctx) // ends with ctx; the records' errors tell the rest
	}
	select {
	case <-all:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	out := make([]error, len(records))
	for i := range records {
		out[i] = errs[i]
		if !finished[i] {
			out[i] = fmt.Errorf("no answer in time: %w", context.Cause(ctx))
		}
	}
	return out, left == 0
}
