package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// publishKeyed publishes perKey messages for each of keys keys (in rounds,
// so keys interleave), with metadata "n" counting per key from 1.
func publishKeyed(t *testing.T, e env, topic string, keys, perKey int) []string {
	t.Helper()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var uuids []string
	for n := 1; n <= perKey; n++ {
		var batch []*message.Message
		for k := 0; k < keys; k++ {
			m := message.NewMessage(fmt.Sprintf("k%d-n%d", k, n), []byte("p"))
			m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "key-"+strconv.Itoa(k))
			m.Metadata.Set("n", strconv.Itoa(n))
			batch = append(batch, m)
			uuids = append(uuids, m.UUID)
		}
		if err := pub.Publish(topic, batch...); err != nil {
			t.Fatal(err)
		}
	}
	return uuids
}

// handled records handler invocations in the order they happened.
type handled struct {
	mu    sync.Mutex
	calls []call
	ids   map[string]int
}

type call struct {
	instance string
	uuid     string
	key      string
	n        int
	id       string
	seq      int64
}

func (h *handled) add(instance string, m *message.Message) (duplicate bool) {
	n, _ := strconv.Atoi(m.Metadata.Get("n"))
	seq, _ := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSeq), 10, 64)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ids == nil {
		h.ids = map[string]int{}
	}
	id := m.Metadata.Get(outbox.MetadataID)
	h.ids[id]++
	h.calls = append(h.calls, call{instance, m.UUID, m.Metadata.Get(outbox.PublishPartitionKeyMetadata), n, id, seq})
	return h.ids[id] > 1
}

func (h *handled) by(instance string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.calls {
		if c.instance == instance {
			n++
		}
	}
	return n
}

func (h *handled) distinct() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ids)
}

// checkOrder verifies that, per key, first deliveries arrive in publish order
// and every duplicate carries an id delivered before.
func (h *handled) checkOrder(t *testing.T, uuids []string) (duplicates int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	lastN := map[string]int{}
	got := map[string]bool{}
	for _, c := range h.calls {
		got[c.uuid] = true
		if seen[c.id] {
			duplicates++
			continue
		}
		seen[c.id] = true
		if c.n != lastN[c.key]+1 {
			t.Fatalf("key %s: message n=%d handled after n=%d (instance %s)", c.key, c.n, lastN[c.key], c.instance)
		}
		lastN[c.key] = c.n
	}
	for _, u := range uuids {
		if !got[u] {
			t.Fatalf("message %s never reached a handler", u)
		}
	}
	return duplicates
}

// consume runs a subscription that acks everything after an optional
// per-message delay, until ctx ends.
func consume(ctx context.Context, t *testing.T, sub *outbox.Subscriber, topic, instance string, h *handled, delay time.Duration) *sync.WaitGroup {
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for m := range msgs {
			h.add(instance, m)
			time.Sleep(delay)
			m.Ack()
		}
	}()
	return &wg
}

func newSub(t *testing.T, e env, group string, tune func(*outbox.SubscriberConfig)) *outbox.Subscriber {
	t.Helper()
	cfg := outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, ConsumerGroup: group, Tuning: outboxtest.FastTuning(), Advanced: outboxtest.FastAdvanced(), CloseTimeout: time.Second}
	if tune != nil {
		tune(&cfg)
	}
	sub, err := outbox.NewSubscriber(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

func TestThreeInstancesShareSixteenPartitionsThroughChurn(t *testing.T) {
	// Not parallel: goleak sees every goroutine of the process.
	e := newEnv(t)
	e.Register("orders", 16)
	leakOpts := goleak.IgnoreCurrent()
	uuids := publishKeyed(t, e, "orders", 64, 40) // 2,560 messages
	h := &handled{}

	a, b := newSub(t, e, "billing", nil), newSub(t, e, "billing", nil)
	ctxA, cancelA := context.WithCancel(context.Background())
	const delay = 3 * time.Millisecond // slow enough that the churn happens mid-stream
	wgA := consume(ctxA, t, a, "orders", "A", h, delay)
	wgB := consume(context.Background(), t, b, "orders", "B", h, delay)

	// Cancel A in the middle of its batches (once both have been working),
	// then add C.
	outboxtest.WaitFor(t, "A and B both at work", time.Minute, func() bool { return h.by("A") >= 50 && h.by("B") >= 50 })
	cancelA()
	wgA.Wait()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	c := newSub(t, e, "billing", nil)
	wgC := consume(context.Background(), t, c, "orders", "C", h, delay)
	outboxtest.WaitFor(t, "C to take its share", time.Minute, func() bool { return h.by("C") >= 50 })

	outboxtest.WaitFor(t, "every message", 2*time.Minute, func() bool { return h.distinct() == len(uuids) })
	dups := h.checkOrder(t, uuids)
	t.Logf("%d deliveries, %d distinct, %d duplicates", len(h.calls), h.distinct(), dups)
	// A stopped cleanly (its acked prefix was recorded before its leases were
	// released), so nobody had to redeliver more than one in-flight message
	// per partition.
	if dups > 16 {
		t.Fatalf("%d duplicates after a clean stop", dups)
	}
	byInstance := map[string]int{}
	for _, cl := range h.calls {
		byInstance[cl.instance]++
	}
	if byInstance["A"] == 0 || byInstance["B"] == 0 || byInstance["C"] == 0 {
		t.Fatalf("work was not shared: %v", byInstance)
	}
	for _, s := range []*outbox.Subscriber{b, c} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	wgB.Wait()
	wgC.Wait()
	goleak.VerifyNone(t, leakOpts)
}

func TestFrozenInstanceCannotMoveTheCursorAfterTakeover(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("single", 1)
	uuids := publishKeyed(t, e, "single", 1, 20)
	e.SequenceAll()

	pool, freeze, thaw := pgtest.FreezablePool(t)
	zombie := newSub(t, env{e.WithPool(pool)}, "g", func(c *outbox.SubscriberConfig) { c.DisableSequencer = true })
	defer zombie.Close()
	msgsA, err := zombie.Subscribe(context.Background(), "single")
	if err != nil {
		t.Fatal(err)
	}
	first := <-msgsA // the zombie holds message 1 ...
	if first.UUID != uuids[0] {
		t.Fatalf("first delivery %s, want %s", first.UUID, uuids[0])
	}
	freeze() // ... and stops dead: its lease runs out.

	other := newSub(t, e, "g", nil)
	defer other.Close()
	msgsB, err := other.Subscribe(context.Background(), "single")
	if err != nil {
		t.Fatal(err)
	}
	var again *message.Message
	select {
	case again = <-msgsB: // the new owner took over and got message 1 again
	case <-time.After(time.Minute):
		t.Fatal("nobody took over the expired lease")
	}
	if again.Metadata.Get(outbox.MetadataID) != first.Metadata.Get(outbox.MetadataID) {
		t.Fatalf("takeover redelivered %s, want the in-flight message %s", again.Metadata.Get(outbox.MetadataID), first.Metadata.Get(outbox.MetadataID))
	}
	cursor := func() int64 {
		var seq int64
		if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT seq FROM "+e.Schema+".cursors WHERE group_name = 'g'").Scan(&seq); err != nil {
			t.Fatal(err)
		}
		return seq
	}

	// While the new owner still works on message 1, the zombie's handler
	// finishes and the process thaws. Moving the cursor from 0 to 1 would be
	// a valid step by itself: only the lease token can refuse it.
	first.Ack()
	thaw()
	time.Sleep(time.Second)
	if got := cursor(); got != 0 {
		t.Fatalf("zombie moved the cursor to %d", got)
	}
	// The thawed zombie's old lease delivers nothing more. (Thawed, it is
	// a live member again: its return is announced and it may take the
	// partition back at once, under a new lease with a larger token, and
	// deliver from the cursor; that is not the zombie's old worker.)
	oldToken, _ := consumer.LeaseToken(first)
	select {
	case m, ok := <-msgsA:
		if token, _ := consumer.LeaseToken(m); ok && token <= oldToken {
			t.Fatalf("zombie delivered %s under its lost lease (token %d)", m.UUID, token)
		}
		if ok {
			m.Nack() // a new lease's delivery: it comes again to whoever holds the partition
		}
	case <-time.After(300 * time.Millisecond):
	}

	// Once thawed the zombie is a live member again and may be handed the
	// partition back; shut it down so the other instance owns the stream.
	// Everything arrives, first deliveries in order; a repeat can only be
	// an earlier message again (same id).
	if err := zombie.Close(); err != nil {
		t.Fatal(err)
	}
	again.Ack()
	seen := map[string]bool{first.Metadata.Get(outbox.MetadataID): true}
	next := 1
	for next < len(uuids) {
		var m *message.Message
		select {
		case m = <-msgsB:
		case <-time.After(time.Minute):
			t.Fatalf("stalled after %d messages", next)
		}
		id := m.Metadata.Get(outbox.MetadataID)
		if !seen[id] {
			if m.UUID != uuids[next] {
				t.Fatalf("delivery %d = %s, want %s", next, m.UUID, uuids[next])
			}
			seen[id] = true
			next++
		}
		m.Ack()
	}
	outboxtest.WaitFor(t, "the cursor at the end", 30*time.Second, func() bool { return cursor() == int64(len(uuids)) })
}

// rejectLog is a RejectHandler that stores rejected messages in a table, in
// the transaction that moves the cursor.
func rejectLog(t *testing.T, e env) (outboxtype.RejectHandler, func() []outboxtype.RejectedMessage) {
	t.Helper()
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "CREATE TABLE "+e.Schema+".rejects (uuid text PRIMARY KEY, seq bigint, attempts int, reason text)"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []outboxtype.RejectedMessage
	handler := outboxtype.RejectHandlerFunc(func(c context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
		if _, err := tx.Exec(c, "INSERT INTO "+e.Schema+".rejects VALUES ($1, $2, $3, $4)", m.UUID, m.Seq, m.Attempts, m.Reason.Error()); err != nil {
			return err
		}
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
		return nil
	})
	return handler, func() []outboxtype.RejectedMessage {
		mu.Lock()
		defer mu.Unlock()
		return append([]outboxtype.RejectedMessage(nil), got...)
	}
}

func TestPoisonMessageIsIsolatedWhileOtherPartitionsFlow(t *testing.T) {
	t.Parallel()
	for _, strategy := range []outbox.Strategy{outbox.Leased, outbox.Transactional} {
		t.Run(strategy.String(), func(t *testing.T) {
			e := newEnv(t)
			e.Register("events", 4)
			rejects, rejected := rejectLog(t, e)
			// 1,000 messages on one key (one partition) with a poison one early
			// on, and 600 on other keys.
			pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			const poison = 5
			var hot []*message.Message
			for i := 1; i <= 1000; i++ {
				m := message.NewMessage("hot-"+strconv.Itoa(i), []byte(strconv.Itoa(i)))
				m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "hot")
				hot = append(hot, m)
			}
			if err := pub.Publish("events", hot...); err != nil {
				t.Fatal(err)
			}
			var cold []*message.Message
			for i := 0; i < 600; i++ {
				key := "cold-" + strconv.Itoa(i)
				m := message.NewMessage(key, nil)
				m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
				cold = append(cold, m)
			}
			if err := pub.Publish("events", cold...); err != nil {
				t.Fatal(err)
			}
			e.SequenceAll()
			var hotPartition int
			if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT partition FROM "+e.Schema+".log WHERE uuid = 'hot-1'").Scan(&hotPartition); err != nil {
				t.Fatal(err)
			}

			tune := outboxtest.FastTuning()
			tune.BatchSize = 64
			tune.BackoffBase = 100 * time.Millisecond
			sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) {
				c.Strategy = strategy
				c.Tuning = tune
				c.RejectHandler = rejects
				c.MaxAttempts = 3
			})
			defer sub.Close()
			msgs, err := sub.Subscribe(context.Background(), "events")
			if err != nil {
				t.Fatal(err)
			}
			poisonAttempts, coldDone, coldWhilePoisoned := 0, 0, 0
			var hotOrder []int
			for delivered := 0; delivered < 999+600; {
				var m *message.Message
				select {
				case m = <-msgs:
				case <-time.After(30 * time.Second):
					t.Fatalf("stalled: %d hot delivered, %d cold, %d poison attempts", len(hotOrder), coldDone, poisonAttempts)
				}
				isHot := m.Metadata.Get(outbox.PublishPartitionKeyMetadata) == "hot"
				switch {
				case m.UUID == "hot-"+strconv.Itoa(poison):
					poisonAttempts++
					if attempt := m.Metadata.Get(outbox.MetadataAttempt); attempt != strconv.Itoa(poisonAttempts) {
						t.Fatalf("attempt metadata %s on delivery %d", attempt, poisonAttempts)
					}
					m.Nack()
					continue
				case isHot:
					i, _ := strconv.Atoi(string(m.Payload))
					hotOrder = append(hotOrder, i)
				default:
					coldDone++
					partition, _ := strconv.Atoi(m.Metadata.Get(outbox.MetadataPartition))
					if poisonAttempts > 0 && len(hotOrder) < poison && partition != hotPartition {
						coldWhilePoisoned++
					}
				}
				m.Ack()
				delivered++
			}
			for i, n := range hotOrder {
				want := i + 1
				if want >= poison {
					want++
				}
				if n != want {
					t.Fatalf("hot partition out of order at %d: got %d, want %d", i, n, want)
				}
			}
			if poisonAttempts != 3 {
				t.Fatalf("poison delivered %d times, want exactly MaxAttempts=3", poisonAttempts)
			}
			rs := rejected()
			if len(rs) != 1 || rs[0].UUID != "hot-"+strconv.Itoa(poison) || rs[0].Attempts != 3 || rs[0].Partition != hotPartition || !errors.Is(rs[0].Reason, outbox.ErrPoison) {
				t.Fatalf("rejected = %+v", rs)
			}
			// The other partitions kept flowing while the poison message was
			// being retried with backoff.
			if coldWhilePoisoned < 20 {
				t.Fatalf("only %d messages of other partitions were handled while the poison message was retried", coldWhilePoisoned)
			}
			t.Logf("%d messages of other partitions handled during the poison's retries", coldWhilePoisoned)
		})
	}
}

func TestRejectTakesMessageOutAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("r", 1)
	rejects, rejected := rejectLog(t, e)
	uuids := publishKeyed(t, e, "r", 1, 10)
	sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) { c.RejectHandler = rejects })
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "r")
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for len(order) < 10 {
		m := <-msgs
		order = append(order, m.UUID)
		if m.UUID == uuids[3] {
			if err := outbox.Reject(m, errors.New("unparseable")); !errors.Is(err, outbox.ErrPoison) {
				t.Fatalf("Reject returned %v", err)
			}
			m.Nack() // a Router nacks a handler error; the rejection wins
			continue
		}
		m.Ack()
	}
	for i, u := range order {
		if u != uuids[i] {
			t.Fatalf("delivery %d = %s, want %s (a rejected message must not be retried)", i, u, uuids[i])
		}
	}
	rs := rejected()
	if len(rs) != 1 || rs[0].UUID != uuids[3] || rs[0].Attempts != 1 || rs[0].Reason.Error() != "unparseable" {
		t.Fatalf("rejected = %+v", rs)
	}
}

func TestTransactionalStrategyHasExactlyOnceEffects(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("tx", 4)
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "CREATE TABLE "+e.Schema+".effects (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	uuids := publishKeyed(t, e, "tx", 8, 50)
	sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) { c.Strategy = outbox.Transactional })
	msgs, err := sub.Subscribe(context.Background(), "tx")
	if err != nil {
		t.Fatal(err)
	}
	var deliveries int
	rng := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			deliveries++
			txAny, ok := outbox.TxFromContext[any](m.Context())
			if !ok {
				t.Error("no transaction in the message context")
				m.Nack()
				continue
			}
			tx := txAny.(pgx.Tx)
			// The write happens, then every 7th delivery is nacked: its write
			// must vanish with the savepoint, and the retry must write again.
			if _, err := tx.Exec(m.Context(), "INSERT INTO "+e.Schema+".effects VALUES ($1)", m.Metadata.Get(outbox.MetadataID)); err != nil {
				t.Errorf("effect: %v", err)
				m.Nack()
				continue
			}
			rng++
			if rng%7 == 0 {
				m.Nack()
				continue
			}
			m.Ack()
		}
	}()
	outboxtest.WaitFor(t, "every effect", time.Minute, func() bool { return e.Rows("effects") == len(uuids) })
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	<-done
	if n := e.Rows("effects"); n != len(uuids) {
		t.Fatalf("%d effects, want %d", n, len(uuids))
	}
	if deliveries <= len(uuids) {
		t.Fatalf("%d deliveries: the nacks did not cause retries", deliveries)
	}
}
