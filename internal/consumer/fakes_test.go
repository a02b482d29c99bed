package consumer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/consumer/consumerfake"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/internal/worker"
)

// The unit tests drive a Worker with the in-memory parts of
// internal/consumer/consumerfake (pinned to the PostgreSQL statements by
// integration/consumerstore): fakeStore (the log, the cursor row, held
// rows, transactions) and fakeLease (the partition's lease on that cursor
// row).
type (
	fakeStore = consumerfake.Store
	fakeLease = consumerfake.Lease
	fakeTx    = consumerfake.Tx
	cursorRow = consumerfake.CursorRow
	heldRow   = consumerfake.Held
)

func newFakeStore(payloads ...string) *fakeStore { return consumerfake.New(payloads...) }

func newFakeLease(s *fakeStore) *fakeLease { return consumerfake.NewLease(s) }

// rejects is a RejectHandler that keeps what it was given, once its
// transaction commits; fail makes the next call fail.
type rejects struct {
	mu   sync.Mutex
	got  []RejectedMessage
	fail error
}

func (r *rejects) HandleReject(_ context.Context, tx pgx.Tx, m RejectedMessage) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fail; err != nil {
		r.fail = nil
		return err
	}
	tx.(*fakeTx).Do(func() {
		r.mu.Lock()
		r.got = append(r.got, m)
		r.mu.Unlock()
	})
	return nil
}

func (r *rejects) taken() []RejectedMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]RejectedMessage(nil), r.got...)
}

// rig is a worker on the fake store, with its subscription's channel: a
// test answers the messages it hands out with serve, or reads them itself.
type rig struct {
	t       *testing.T
	store   *fakeStore
	lease   *fakeLease
	cfg     *Config
	out     chan *message.Message
	w       *Worker
	tasks   *Tasks // started; stopped when the test ends (the Subscriber closes)
	rejects *rejects
	// unstopped: the test ends without the worker's Stop, so that a
	// coverage run of it holds one delivery alone (deliverypath).
	unstopped bool
}

// tuning is the Tuning of the unit tests: batches of up to 8, backoff
// 100 ms doubling to 1 s.
func tuning() tune.Settings {
	return tune.Default.Settings(8, 100*time.Millisecond, time.Second, tune.Default.PollInterval)
}

// newRig makes a worker of the store's partition with edit applied to its
// Config (the Leased strategy, MaxAttempts 3 with a RejectHandler,
// HandlerTimeout 1 s, by default); batch, when set, makes it a
// ConsumeBatches worker. Call it inside the test's synctest bubble.
func newRig(t *testing.T, s *fakeStore, edit func(*Config, *fakeLease), batch BatchHandler) *rig {
	t.Helper()
	r := &rig{t: t, store: s, lease: newFakeLease(s), out: make(chan *message.Message), tasks: NewTasks(), rejects: &rejects{}}
	if err := r.tasks.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.cfg = &Config{
		Group: "g", MaxAttempts: 3, HandlerTimeout: time.Second, CloseTimeout: 100 * time.Millisecond,
		Tuning: tuning(), RejectHandler: r.rejects, Store: s, Careful: &Careful{},
		Bulkhead: mustBulkhead(t), Logger: watermill.NopLogger{}, Tasks: r.tasks, Counts: &Counts{},
		Gate: NewGate(),
	}
	if edit != nil {
		edit(r.cfg, r.lease)
	}
	var out chan<- *message.Message = r.out
	if batch != nil {
		out = nil
	}
	r.w = NewWorker(r.cfg, "orders", "1", r.lease, out, batch)
	t.Cleanup(func() {
		if !r.unstopped {
			r.w.Stop()
		}
		r.lease.Cancel(errors.New("test over"))
		r.tasks.Stop()
	})
	return r
}

func mustBulkhead(t *testing.T) *worker.Bulkhead {
	b, err := worker.NewBulkhead(4)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// answer is how serve answers a message: ack, nack, or nothing (it holds
// the message; the worker times out or the lease ends).
type answer func(m *message.Message)

func ack(m *message.Message)  { m.Ack() }
func nack(m *message.Message) { m.Nack() }
func hold(*message.Message)   {}

// step runs one turn of the worker while answering the messages it hands
// out with how (by payload; ack for the others); it returns the turn's
// directive and error, and the messages in the order they were handed out.
func (r *rig) step(how map[string]answer) (worker.Directive, []*message.Message, error) {
	r.t.Helper()
	type result struct {
		dir worker.Directive
		err error
	}
	done := make(chan result, 1)
	go func() {
		dir, err := r.w.Step(r.lease.Context())
		done <- result{dir, err}
	}()
	var got []*message.Message
	for {
		select {
		case res := <-done:
			return res.dir, got, res.err
		case m := <-r.out:
			got = append(got, m)
			a, ok := how[string(m.Payload)]
			if !ok {
				a = ack
			}
			go a(m)
		}
	}
}

// uuids lists the uuids of msgs.
func uuids(msgs []*message.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.UUID
	}
	return out
}
