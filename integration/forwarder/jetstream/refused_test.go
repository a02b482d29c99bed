package jetstream_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	natsjs "github.com/nats-io/nats.go/jetstream"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// A message the stream refuses for what it is (its size, its headers, a
// JetStream header whose demand the stream cannot meet) is rejected on its first Send, the messages before it are stored
// once, in order; the rest, sent after, are stored once too (those the
// first Send had published behind the poison are dropped by the server as
// duplicates of the same Nats-Msg-Id).
func TestJetStreamSendRejectsAMessageTheStreamRefusesForGood(t *testing.T) {
	s := startNATS(t, -1, t.TempDir(), nil)
	target := newJetStreamTarget(t, s.ClientURL())
	js := target.JetStream()
	for name, c := range map[string]struct {
		poison func(*message.Message)
		reason string
	}{
		"over MaxMsgSize":         {func(m *message.Message) { m.Payload = make([]byte, 20<<10) }, "maximum"},
		"over max_payload":        {func(m *message.Message) { m.Payload = make([]byte, 2<<20) }, "maximum payload"},
		"headers over 64 KiB":     {func(m *message.Message) { m.Metadata.Set("note", strings.Repeat("x", 70<<10)) }, "header size exceeds"},
		"another expected stream": {func(m *message.Message) { m.Metadata.Set("Nats-Expected-Stream", "elsewhere") }, "expected stream does not match"},
		"invalid TTL":             {func(m *message.Message) { m.Metadata.Set("Nats-TTL", "soon") }, "invalid per-message TTL"},
		"TTL on a stream without": {func(m *message.Message) { m.Metadata.Set("Nats-TTL", "1h") }, "per-message TTL is disabled"},
	} {
		t.Run(name, func(t *testing.T) {
			stream := "s" + strconv.FormatInt(time.Now().UnixNano(), 36)
			maxMsgSize := int32(-1)
			if name == "over MaxMsgSize" {
				maxMsgSize = 16 << 10
			}
			if name == "headers over 64 KiB" {
				maxMsgSize = -1
			}
			if _, err := js.CreateStream(outboxtest.Ctx(t), natsjs.StreamConfig{Name: stream, Subjects: []string{stream}, MaxMsgSize: maxMsgSize}); err != nil {
				t.Fatal(err)
			}
			batch := fwdtest.OutboxBatch(12, fwdtest.SameKey)
			const poison = 6
			c.poison(batch[poison])
			done, err := target.Send(outboxtest.Ctx(t), stream, batch)
			if done != poison || !errors.Is(err, outbox.ErrPoison) || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("Send: done %d, %v; want %d and a rejection mentioning %q", done, err, poison, c.reason)
			}
			rest := batch[poison+1:]
			if done, err := target.Send(outboxtest.Ctx(t), stream, rest); done != len(rest) || err != nil {
				t.Fatalf("Send of the rest: done %d of %d, %v", done, len(rest), err)
			}
			fwdtest.AssertPositions(t, "stream", streamPositions(t, js, stream), fwdtest.UpTo(0, 12, poison))
		})
	}
}

// streamPositions returns metadata "i" of every message of stream, in
// stream order.
func streamPositions(t *testing.T, js natsjs.JetStream, stream string) []int {
	t.Helper()
	st, err := js.Stream(outboxtest.Ctx(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(outboxtest.Ctx(t), seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		i, _ := strconv.Atoi(m.Header.Get("i"))
		out = append(out, i)
	}
	return out
}

// End to end, through a Forwarder: refused messages in the middle of
// batches are dead-lettered on their first attempt, the partition never
// fails a send for them, and the rest arrives once, in key order.
func TestJetStreamRefusedMessagesAreDeadLetteredOnTheirFirstAttempt(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 2)
	s := startNATS(t, -1, t.TempDir(), func(o *server.Options) { o.MaxPayload = 256 << 10 })
	createStream(t, s.ClientURL(), "orders", 0)
	pub := fwdtest.NewPublisher(t, e)
	poison := map[string]bool{}
	for i := 0; i < 12; i++ {
		pub.Round("orders", 8, func(m *message.Message) {
			switch m.Metadata.Get("n") + "/" + m.Metadata.Get(outbox.PublishPartitionKeyMetadata) {
			case "4/key-2":
				m.Metadata.Set("Nats-TTL", "soon") // no valid TTL
				poison[m.UUID] = true
			case "9/key-5":
				m.Metadata.Set("Nats-Expected-Stream", "elsewhere")
				poison[m.UUID] = true
			case "6/key-6":
				m.Metadata.Set("Nats-TTL", "1h") // the stream does not allow TTLs
				poison[m.UUID] = true
			}
		})
	}
	attempts := &fwdtest.AttemptLog{}
	fwd := fwdtest.StartForwarder(t, e, nil, newJetStreamTarget(t, s.ClientURL()), []string{"orders"}, func(c *forwarder.Config) {
		c.Subscriber.RejectHandler = attempts.Wrap(e.DeadLetters())
		// A failed send would show: it holds the partition for a minute.
		c.Subscriber.Tuning.BackoffBase, c.Subscriber.Tuning.BackoffMax = time.Minute, time.Minute
	})
	r := &fwdtest.Received{}
	consumeJetStream(t, s.ClientURL(), "orders", r)
	outboxtest.WaitFor(t, "every message forwarded or dead-lettered", 30*time.Second, func() bool {
		return r.Distinct() == pub.Count()-len(poison) && len(e.DeadLettered(t)) == len(poison)
	})
	dead := e.DeadLettered(t)
	for u := range poison {
		if _, ok := dead[u]; !ok || attempts.Of(u) != 1 {
			t.Fatalf("poison %s: dead-lettered %v after %d attempts; want once, on its first attempt (%v)", u, ok, attempts.Of(u), dead[u])
		}
	}
	if dups := r.Check(t, pub.Snapshot(), dead); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
	if st := fwd.Stats(); st.Failures != st.Rejected {
		t.Fatalf("stats %+v: sends failed for other reasons than the rejections", st)
	}
}

// Failure mode 4 of issue 10 on JetStream: a message over the stream's
// MaxMsgSize is rejected on its first attempt, the messages around it
// delivered once.
func TestJetStreamRefusedMessageIsRejectedOnItsFirstAttempt(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 1)
	s := startNATS(t, -1, t.TempDir(), nil)
	createStream(t, s.ClientURL(), "orders", 16<<10)
	pub := fwdtest.NewPublisher(t, e)
	big := map[string]bool{}
	for i := 0; i < 12; i++ {
		pub.Round("orders", 10, func(m *message.Message) {
			switch m.Metadata.Get("n") + "/" + m.Metadata.Get(outbox.PublishPartitionKeyMetadata) {
			case "3/key-4", "8/key-7":
				m.Payload = make([]byte, 20<<10) // over the stream's MaxMsgSize
				big[m.UUID] = true
			}
		})
	}
	var mu sync.Mutex
	attempts := map[string]int{}
	inner := e.DeadLetters()
	fwdtest.StartForwarder(t, e, nil, newJetStreamTarget(t, s.ClientURL()), []string{"orders"}, func(c *forwarder.Config) {
		c.Subscriber.RejectHandler = outboxtype.RejectHandlerFunc(func(ctx context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
			mu.Lock()
			attempts[m.UUID] = m.Attempts
			mu.Unlock()
			return inner.HandleReject(ctx, tx, m)
		})
		c.Subscriber.Tuning.BatchSize = 64
		c.Subscriber.Tuning.BackoffBase, c.Subscriber.Tuning.BackoffMax = time.Minute, time.Minute
	})
	r := &fwdtest.Received{}
	consumeJetStream(t, s.ClientURL(), "orders", r)
	outboxtest.WaitFor(t, "every message forwarded or dead-lettered", 30*time.Second, func() bool {
		return r.Distinct() == pub.Count()-len(big) && len(e.DeadLettered(t)) == len(big)
	})
	dead := e.DeadLettered(t)
	mu.Lock()
	defer mu.Unlock()
	for u := range big {
		if _, ok := dead[u]; !ok || attempts[u] != 1 {
			t.Fatalf("oversize message %s: dead-lettered %v after %d attempts; want once, on its first attempt", u, ok, attempts[u])
		}
	}
	if dups := r.Check(t, pub.Snapshot(), dead); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
}
