package kafka

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/observe"
)

// The batches that arrive while a round is in flight go together in the
// next one: one Kafka transaction for all their partitions, through the
// target's one transactional producer.
func TestBatchesThatMeetInFlightGoInOneTransaction(t *testing.T) {
	var seen transactionsSeen
	defer observe.Add(&seen)()
	synctest.Test(t, func(t *testing.T) {
		d := &roundsDriver{hold: make(chan struct{})}
		target := newTarget(Config{Brokers: []string{"fake:9092"}}, nil, func(watermill.LoggerAdapter) (kafkadriver.Driver, error) { return d, nil }, "test")
		defer target.Close()
		ctx := context.Background()
		send := func(p int, done chan<- error) {
			n, err := target.Send(ctx, "orders", roundsBatch(p, 3))
			if err == nil && n != 3 {
				err = errPartialConfirm(n)
			}
			done <- err
		}
		first := make(chan error, 1)
		go send(0, first)
		synctest.Wait() // partition 0's round is committing, held
		rest := make(chan error, 3)
		for p := 1; p <= 3; p++ {
			go send(p, rest)
		}
		synctest.Wait() // partitions 1-3 wait for the next round
		close(d.hold)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := <-rest; err != nil {
				t.Fatal(err)
			}
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.committed) != 2 {
			t.Fatalf("%d transactions committed, want 2: %v", len(d.committed), d.committed)
		}
		if got := d.committed[0]; len(got) != 1 || got[0] != 3 {
			t.Errorf("first transaction: records per partition %v, want partition 0's 3", got)
		}
		if got := d.committed[1]; len(got) != 3 || got[1] != 3 || got[2] != 3 || got[3] != 3 {
			t.Errorf("second transaction: records per partition %v, want 3 of each of partitions 1-3", got)
		}
		if got := seen.batches(); len(got) != 2 || got[0] != 1 || got[1] != 3 {
			t.Errorf("observed transactions of %v batches, want [1 3] (outbox_forwarder_kafka_transaction_batches)", got)
		}
		if d.ids[DefaultTransactionalIDPrefix+"/test"] != 1 {
			t.Errorf("the target's producer started %d times, want once: %v", d.ids[DefaultTransactionalIDPrefix+"/test"], d.ids)
		}
	})
}

// transactionsSeen records the KafkaTransaction events.
type transactionsSeen struct {
	observe.Nop
	mu   sync.Mutex
	seen []int
}

func (o *transactionsSeen) KafkaTransaction(batches int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, batches)
}

func (o *transactionsSeen) batches() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]int(nil), o.seen...)
}

type errPartialConfirm int

func (e errPartialConfirm) Error() string { return "confirmed " + strconv.Itoa(int(e)) + " of 3" }

// roundsBatch is n messages of outbox partition p, seqs 1..n, delivered
// under a lease of their own (a writer record that starts empty).
func roundsBatch(p, n int) []*message.Message {
	rec := &memWriter{}
	var out []*message.Message
	for s := 1; s <= n; s++ {
		m := message.NewMessage("m-"+strconv.Itoa(p)+"-"+strconv.Itoa(s), []byte("x"))
		m.Metadata.Set(outbox.MetadataTopic, "orders")
		m.Metadata.Set(outbox.MetadataPartition, strconv.Itoa(p))
		m.Metadata.Set(outbox.MetadataSeq, strconv.Itoa(s))
		m.Metadata.Set(outbox.MetadataID, "orders/"+strconv.Itoa(p)+"/"+strconv.Itoa(s))
		m.SetContext(consumer.Delivered(context.Background(), 1, rec))
		out = append(out, m)
	}
	return out
}

type memWriter struct {
	mu     sync.Mutex
	writer string
}

func (w *memWriter) Writer(context.Context) (string, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writer, true, nil
}

func (w *memWriter) SetWriter(_ context.Context, writer string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writer = writer
	return nil
}

// roundsDriver is an in-memory Kafka driver: it records each committed
// transaction's records per outbox partition; the first commit waits for
// hold.
type roundsDriver struct {
	hold      chan struct{}
	mu        sync.Mutex
	committed []map[int]int
	ids       map[string]int // InitProducerIds per transactional id
	held      bool
}

func (d *roundsDriver) Compressed() bool { return false }
func (d *roundsDriver) TopicPartitions(context.Context, string) (int, bool, error) {
	return 4, true, nil
}
func (d *roundsDriver) CreateTopic(context.Context, string, int) error { return nil }
func (d *roundsDriver) Offsets(context.Context, string) (map[int32]kafkadriver.PartitionOffsets, error) {
	return map[int32]kafkadriver.PartitionOffsets{0: {}, 1: {}, 2: {}, 3: {}}, nil
}
func (d *roundsDriver) ReadLog(context.Context, string, int32, int64, int64) ([]kafkadriver.LogRecord, error) {
	return nil, nil
}
func (d *roundsDriver) Transactional(id string) (kafkadriver.Transactional, error) {
	return &roundsTxn{d: d, id: id}, nil
}
func (d *roundsDriver) Idempotent() (kafkadriver.Idempotent, error) { return nil, nil }
func (d *roundsDriver) Close()                                      {}

type roundsTxn struct {
	d       *roundsDriver
	id      string
	records []*kgo.Record
}

func (x *roundsTxn) Init(context.Context) error {
	x.d.mu.Lock()
	defer x.d.mu.Unlock()
	if x.d.ids == nil {
		x.d.ids = map[string]int{}
	}
	x.d.ids[x.id]++
	return nil
}
func (x *roundsTxn) Begin() error { x.records = nil; return nil }
func (x *roundsTxn) Produce(_ context.Context, rs []*kgo.Record) ([]error, bool) {
	x.records = append(x.records, rs...)
	return make([]error, len(rs)), true
}
func (x *roundsTxn) End(_ context.Context, commit bool) (bool, error) {
	x.d.mu.Lock()
	first := !x.d.held
	x.d.held = true
	x.d.mu.Unlock()
	if first {
		<-x.d.hold
	}
	if !commit {
		return false, nil
	}
	perPartition := map[int]int{}
	for _, r := range x.records {
		for _, h := range r.Headers {
			if h.Key == outbox.MetadataID {
				p, _ := strconv.Atoi(string(h.Value)[len("orders/") : len("orders/")+1])
				perPartition[p]++
			}
		}
	}
	x.d.mu.Lock()
	x.d.committed = append(x.d.committed, perPartition)
	x.d.mu.Unlock()
	return true, nil
}
func (x *roundsTxn) Close() {}

// Close waits for the round in flight to end.
func TestCloseWaitsForTheRoundInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &roundsDriver{hold: make(chan struct{})}
		target := newTarget(Config{Brokers: []string{"fake:9092"}}, nil, func(watermill.LoggerAdapter) (kafkadriver.Driver, error) { return d, nil }, "test")
		sent := make(chan error, 1)
		go func() {
			_, err := target.Send(context.Background(), "orders", roundsBatch(0, 2))
			sent <- err
		}()
		synctest.Wait() // the round is committing, held
		closed := make(chan struct{})
		go func() {
			_ = target.Close()
			close(closed)
		}()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while a round was in flight")
		default:
		}
		close(d.hold)
		<-sent
		<-closed
		if _, err := target.Send(context.Background(), "orders", roundsBatch(1, 1)); err == nil {
			t.Error("Send after Close succeeded")
		}
	})
}
