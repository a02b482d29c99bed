package forwarder_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Failure mode 4 of issue 10: a record the broker refuses (over the
// topic's max.message.bytes) inside a batch of many is found within the same Send:
// the records before it are delivered, it is rejected on its first
// attempt, and the partition never backs off for it.
func TestKafkaRefusedRecordIsIsolatedWithinTheSend(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 1)
	const maxBytes = 64 << 10
	kc := kafkatest.New(t)
	kt := kc.Topic(t, "orders", 1, map[string]string{"max.message.bytes": strconv.Itoa(maxBytes)})

	pub := fwdtest.NewPublisher(t, e)
	big := map[string]bool{}
	for i := 0; i < 12; i++ {
		pub.Round("orders", 10, func(m *message.Message) {
			switch m.Metadata.Get("n") + "/" + m.Metadata.Get(outbox.PublishPartitionKeyMetadata) {
			case "3/key-4", "8/key-7", "8/key-8":
				m.Payload = make([]byte, 100<<10) // the broker refuses it; the target's own limit (MaxBatchBytes) is higher
				big[m.UUID] = true
			}
		})
	}
	var mu sync.Mutex
	attempts := map[string]int{}
	inner := e.DeadLetters()
	rejects := outboxtype.RejectHandlerFunc(func(ctx context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
		mu.Lock()
		attempts[m.UUID] = m.Attempts
		mu.Unlock()
		return inner.HandleReject(ctx, tx, m)
	})
	fwd := fwdtest.StartForwarder(t, e, nil, newKafkaTarget(t, kc, false), []string{"orders"}, to(kt, func(c *forwarder.Config) {
		c.Subscriber.RejectHandler = rejects
		c.Subscriber.Tuning.BatchSize = 64
		// A backoff would show: one failure would hold the partition for
		// a minute.
		c.Subscriber.Tuning.BackoffBase, c.Subscriber.Tuning.BackoffMax = time.Minute, time.Minute
	}))
	r := &fwdtest.Received{}
	kc.Consume(t, kt, r)
	outboxtest.WaitFor(t, "every message forwarded or dead-lettered", 30*time.Second, func() bool {
		return r.Distinct() == pub.Count()-len(big) && len(e.DeadLettered(t)) == len(big)
	})
	dead := e.DeadLettered(t)
	mu.Lock()
	defer mu.Unlock()
	for u := range big {
		if _, ok := dead[u]; !ok || attempts[u] != 1 {
			t.Fatalf("oversize message %s: dead-lettered %v after %d attempts; want once, on its first attempt (%v)", u, ok, attempts[u], dead[u])
		}
	}
	if dups := r.Check(t, pub.Snapshot(), dead); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
	t.Logf("stats %+v", fwd.Stats())
}
