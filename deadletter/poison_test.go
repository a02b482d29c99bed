package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// A Router with the PoisonQueue middleware over an outbox Subscriber: the
// handler fails on poison messages; they land in the store with their
// reason and the middleware's metadata, and everything else flows on, in
// order per key, in every partition.
//
// Wiring the store once is enough: with the PoisonQueue middleware alone
// (no RejectHandler on the Subscriber) it works the same.
func TestRouterPoisonQueueDeadLettersPoisonAndTheRestFlows(t *testing.T) {
	for _, wiring := range []string{"store also RejectHandler", "PoisonQueue only"} {
		for _, strategy := range strategies() {
			t.Run(wiring+"/"+strategy.String(), func(t *testing.T) {
				testRouterPoisonQueue(t, strategy, wiring == "PoisonQueue only")
			})
		}
	}
}

func testRouterPoisonQueue(t *testing.T, strategy outbox.Strategy, poisonQueueOnly bool) {
	{
		{
			e := newEnv(t)
			e.Register("events", 4)
			const keys, perKey = 16, 25
			poisonUUIDs := map[string]bool{}
			var msgs []*message.Message
			for n := 1; n <= perKey; n++ {
				for k := 0; k < keys; k++ {
					uuid := fmt.Sprintf("k%d-n%d", k, n)
					payload := "ok"
					// Several poison messages in the partitions of keys 0 and 5.
					if (k == 0 || k == 5) && n%10 == 3 {
						payload = "poison"
						poisonUUIDs[uuid] = true
					}
					msgs = append(msgs, outboxtest.Keyed(uuid, "key-"+strconv.Itoa(k), n, payload))
				}
			}
			e.Publish("events", msgs...)

			sub := e.subscriber(t, "billing", func(c *outbox.SubscriberConfig) {
				c.Strategy = strategy
				if poisonQueueOnly {
					c.RejectHandler = nil
				}
			})
			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			poisonQueue, err := middleware.PoisonQueue(e.store.PoisonPublisher(), "dead_letters")
			if err != nil {
				t.Fatal(err)
			}
			router.AddMiddleware(poisonQueue)

			var mu sync.Mutex
			firstN := map[string][]int{} // key -> n of first deliveries, in order
			seen := map[string]bool{}
			poisonDeliveries := 0
			router.AddConsumerHandler("h", "events", sub, func(msg *message.Message) error {
				if string(msg.Payload) == "poison" {
					mu.Lock()
					poisonDeliveries++
					mu.Unlock()
					return fmt.Errorf("cannot process %s", msg.UUID)
				}
				mu.Lock()
				defer mu.Unlock()
				if !seen[msg.UUID] {
					seen[msg.UUID] = true
					key := msg.Metadata.Get(outbox.PublishPartitionKeyMetadata)
					n, _ := strconv.Atoi(msg.Metadata.Get("n"))
					firstN[key] = append(firstN[key], n)
				}
				return nil
			})
			runDone := make(chan error, 1)
			go func() { runDone <- router.Run(context.Background()) }()

			good := keys*perKey - len(poisonUUIDs)
			outboxtest.WaitFor(t, "every good message handled and every poison one stored", time.Minute, func() bool {
				mu.Lock()
				handled := len(seen)
				mu.Unlock()
				return handled == good && e.count(t, deadletter.Filter{}) == int64(len(poisonUUIDs))
			})
			if err := router.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-runDone; err != nil {
				t.Fatal(err)
			}

			// Every key's good messages arrived in order, including the keys
			// that share a partition with poison ones.
			for k := 0; k < keys; k++ {
				key := "key-" + strconv.Itoa(k)
				var want []int
				for n := 1; n <= perKey; n++ {
					if !poisonUUIDs[fmt.Sprintf("k%d-n%d", k, n)] {
						want = append(want, n)
					}
				}
				if fmt.Sprint(firstN[key]) != fmt.Sprint(want) {
					t.Fatalf("%s: handled %v, want %v", key, firstN[key], want)
				}
			}
			if poisonDeliveries < len(poisonUUIDs) {
				t.Fatalf("%d poison deliveries for %d poison messages", poisonDeliveries, len(poisonUUIDs))
			}

			page, err := e.store.List(outboxtest.Ctx(t), deadletter.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Entries) != len(poisonUUIDs) || page.NextCursor != "" {
				t.Fatalf("%d entries (next %q), want %d", len(page.Entries), page.NextCursor, len(poisonUUIDs))
			}
			for _, en := range page.Entries {
				reason := "cannot process " + en.UUID
				switch {
				case !poisonUUIDs[en.UUID]:
					t.Fatalf("unexpected entry %+v", en)
				case en.Group != "billing" || en.Topic != "events" || en.External || en.Seq < 1 || en.Status != deadletter.StatusPending:
					t.Fatalf("entry %+v", en)
				case en.Reason != reason:
					t.Fatalf("reason %q, want %q", en.Reason, reason)
				case en.Metadata[middleware.ReasonForPoisonedKey] != reason,
					en.Metadata[middleware.PoisonedTopicKey] != "events",
					en.Metadata[middleware.PoisonedHandlerKey] != "h",
					en.Metadata[middleware.PoisonedSubscriberKey] == "":
					t.Fatalf("middleware metadata missing: %v", en.Metadata)
				case en.Metadata[outbox.MetadataID] != outbox.StableID("events", en.Partition, en.Seq):
					t.Fatalf("delivery metadata %v does not match position %d/%d", en.Metadata, en.Partition, en.Seq)
				case string(en.Payload) != "poison" || en.PartitionKey == "" || en.Attempts < 1:
					t.Fatalf("entry %+v", en)
				}
				// The log row at that position is the poison message.
				var uuid string
				if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT uuid FROM "+e.Schema+".log WHERE topic = $1 AND partition = $2 AND seq = $3",
					en.Topic, en.Partition, en.Seq).Scan(&uuid); err != nil || uuid != en.UUID {
					t.Fatalf("log at %d/%d: %q, %v; want %s", en.Partition, en.Seq, uuid, err, en.UUID)
				}
			}
			// Every cursor is at its partition's end.
			if lag := e.Int(`SELECT coalesce(sum(p.last_seq - c.seq), -1) FROM ` + e.Schema + `.cursors c
				JOIN ` + e.Schema + `.partitions p USING (topic, partition) WHERE c.group_name = 'billing'`); lag != 0 {
				t.Fatalf("lag %d after everything was handled", lag)
			}
		}
	}
}

// A message from another subscriber is written directly, as an External
// entry, once however often it is poisoned.
func TestPoisonPublisherStoresForeignMessagesDirectly(t *testing.T) {
	e := newEnv(t)
	logger := watermill.NopLogger{}
	bus := gochannel.NewGoChannel(gochannel.Config{}, logger)
	defer bus.Close()
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	poisonQueue, err := middleware.PoisonQueue(e.store.PoisonPublisher(), "dead_letters")
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(poisonQueue)
	var handled sync.WaitGroup
	handled.Add(3)
	router.AddConsumerHandler("importer", "imports", bus, func(msg *message.Message) error {
		defer handled.Done()
		if string(msg.Payload) == "bad" {
			return errors.New("malformed row")
		}
		return nil
	})
	runDone := make(chan error, 1)
	go func() { runDone <- router.Run(context.Background()) }()
	<-router.Running()

	bad := message.NewMessage("bad-1", []byte("bad"))
	bad.Metadata.Set(outbox.PublishPartitionKeyMetadata, "customer-9")
	bad.Metadata.Set("source", "csv")
	for _, m := range []*message.Message{message.NewMessage("good-1", []byte("good")), bad, bad.Copy()} {
		if err := bus.Publish("imports", m); err != nil {
			t.Fatal(err)
		}
	}
	handled.Wait()
	outboxtest.WaitFor(t, "the entry", 30*time.Second, func() bool { return e.count(t, deadletter.Filter{}) == 1 })
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	page, err := e.store.List(outboxtest.Ctx(t), deadletter.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != 1 {
		t.Fatalf("%d entries, want 1 (the same message twice is one entry)", len(page.Entries))
	}
	en := page.Entries[0]
	if !en.External || en.Partition != -1 || en.Seq != 0 || en.UUID != "bad-1" || en.Group != "importer" ||
		en.Topic != "imports" || en.Reason != "malformed row" || en.PartitionKey != "customer-9" ||
		en.Metadata["source"] != "csv" || en.Metadata[middleware.PoisonedHandlerKey] != "importer" || string(en.Payload) != "bad" {
		t.Fatalf("entry %+v", en)
	}
}

// A crash between writing the dead letter and moving the cursor (here: the
// reject handler writes, then fails, so the transaction rolls back) loses
// nothing and duplicates nothing: the message is retried and stored once.
func TestFailedRejectTransactionNeitherLosesNorDuplicates(t *testing.T) {
	for _, strategy := range strategies() {
		t.Run(strategy.String(), func(t *testing.T) {
			e := newEnv(t)
			e.Register("r", 1)
			var msgs []*message.Message
			for n := 1; n <= 10; n++ {
				msgs = append(msgs, outboxtest.Keyed("m"+strconv.Itoa(n), "k", n, "ok"))
			}
			e.Publish("r", msgs...)

			var mu sync.Mutex
			calls := 0
			crashing := outboxtype.RejectHandlerFunc(func(ctx context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
				if err := e.store.HandleReject(ctx, tx, m); err != nil {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				calls++
				if calls == 1 {
					// The entry is written in tx; the cursor never moves.
					return errors.New("crash after writing the dead letter")
				}
				return nil
			})
			sub := e.subscriber(t, "g", func(c *outbox.SubscriberConfig) {
				c.Strategy = strategy
				c.RejectHandler = crashing
			})
			ch, err := sub.Subscribe(context.Background(), "r")
			if err != nil {
				t.Fatal(err)
			}
			poisonDeliveries := 0
			acked := map[string]bool{}
			for len(acked) < 9 {
				var m *message.Message
				select {
				case m = <-ch:
				case <-time.After(30 * time.Second):
					t.Fatalf("stalled: %d acked, %d poison deliveries", len(acked), poisonDeliveries)
				}
				if m.UUID == "m4" {
					poisonDeliveries++
					_ = outbox.Reject(m, errors.New("bad m4"))
					m.Nack()
					continue
				}
				acked[m.UUID] = true
				m.Ack()
			}
			outboxtest.WaitFor(t, "the cursor at the end", 30*time.Second, func() bool {
				return e.Int("SELECT seq FROM "+e.Schema+".cursors WHERE group_name = 'g'") == 10
			})
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			if poisonDeliveries != 2 || calls != 2 {
				t.Fatalf("poison delivered %d times, reject handler called %d times; want 2 and 2", poisonDeliveries, calls)
			}
			page, err := e.store.List(outboxtest.Ctx(t), deadletter.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// (Attempts counts deliveries as the partition's head: in the
			// Transactional strategy the failed batch is redelivered from its
			// start, so m4 counts again from 1.)
			if len(page.Entries) != 1 || page.Entries[0].UUID != "m4" || page.Entries[0].Seq != 4 || page.Entries[0].Attempts < 1 || page.Entries[0].Reason != "bad m4" {
				t.Fatalf("entries %+v, want exactly m4 at seq 4", page.Entries)
			}
		})
	}
}

// Writing the same rejection twice (a retried write that did commit the
// first time, or two instances racing) keeps one entry: the first.
func TestDuplicateRejectKeepsOneEntry(t *testing.T) {
	e := newEnv(t)
	m := outboxtype.RejectedMessage{
		Group: "g", Topic: "t", Partition: 2, Seq: 17, UUID: "u-17", PartitionKey: "k",
		Metadata: map[string]string{"a": "b"}, Payload: []byte("x"), Reason: errors.New("first"), Attempts: 3,
	}
	for i, reason := range []string{"first", "second", "third"} {
		m.Reason = errors.New(reason)
		err := pgx.BeginFunc(outboxtest.Ctx(t), e.Pool, func(tx pgx.Tx) error {
			if err := e.store.HandleReject(outboxtest.Ctx(t), tx, m); err != nil {
				return err
			}
			// Twice in one transaction, too.
			return e.store.HandleReject(outboxtest.Ctx(t), tx, m)
		})
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	page, err := e.store.List(outboxtest.Ctx(t), deadletter.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != 1 || page.Entries[0].Reason != "first" || page.Entries[0].Seq != 17 || page.Entries[0].Partition != 2 {
		t.Fatalf("entries %+v", page.Entries)
	}
	// Another group rejecting the same message is another entry.
	m.Group = "other"
	if added, err := e.store.Add(outboxtest.Ctx(t), m); err != nil || !added {
		t.Fatalf("Add for another group: %v, %v", added, err)
	}
	if added, err := e.store.Add(outboxtest.Ctx(t), m); err != nil || added {
		t.Fatalf("Add again: %v, %v", added, err)
	}
	if n := e.count(t, deadletter.Filter{}); n != 2 {
		t.Fatalf("%d entries, want 2", n)
	}
}

// Reasons and metadata that PostgreSQL text cannot hold are stored
// cleaned, never refused: a dead letter must not fail to be written.
func TestRejectWithUnstorableTextIsStored(t *testing.T) {
	e := newEnv(t)
	long := make([]byte, 10000)
	for i := range long {
		long[i] = 'x'
	}
	m := outboxtype.RejectedMessage{
		Group: "g", Topic: "t", Partition: 0, Seq: 1, UUID: "u",
		Metadata: map[string]string{"bad\x00key": "v\xff\x00"},
		Reason:   errors.New("nul\x00 and invalid \xff " + string(long)),
	}
	if _, err := e.store.Add(outboxtest.Ctx(t), m); err != nil {
		t.Fatal(err)
	}
	page, err := e.store.List(outboxtest.Ctx(t), deadletter.ListOptions{})
	if err != nil || len(page.Entries) != 1 {
		t.Fatalf("%+v, %v", page, err)
	}
	en := page.Entries[0]
	if len(en.Reason) > deadletter.DefaultMaxReasonBytes || en.Metadata["bad\uFFFDkey"] != "v\uFFFD\uFFFD" || en.Payload == nil {
		t.Fatalf("entry %q %v %v", en.Reason[:40], en.Metadata, en.Payload)
	}
}

// A message nacked MaxAttempts times is dead-lettered by the Subscriber
// through the store, with its attempts and the last failures' times.
func TestMaxAttemptsDeadLetters(t *testing.T) {
	e := newEnv(t)
	e.Register("m", 1)
	var msgs []*message.Message
	for n := 1; n <= 5; n++ {
		msgs = append(msgs, outboxtest.Keyed("m"+strconv.Itoa(n), "k", n, "ok"))
	}
	e.Publish("m", msgs...)
	sub := e.subscriber(t, "g", func(c *outbox.SubscriberConfig) { c.MaxAttempts = 3 })
	ch, err := sub.Subscribe(context.Background(), "m")
	if err != nil {
		t.Fatal(err)
	}
	acked := 0
	for acked < 4 {
		var m *message.Message
		select {
		case m = <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("stalled after %d acks", acked)
		}
		if m.UUID == "m3" {
			m.Nack()
			continue
		}
		acked++
		m.Ack()
	}
	outboxtest.WaitFor(t, "the dead letter", 30*time.Second, func() bool { return e.count(t, deadletter.Filter{}) == 1 })
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	page, err := e.store.List(outboxtest.Ctx(t), deadletter.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	en := page.Entries[0]
	if en.UUID != "m3" || en.Seq != 3 || en.Attempts != 3 || en.LastFailureAt.Before(en.FirstFailureAt) || en.Metadata[outbox.MetadataAttempt] != "3" {
		t.Fatalf("entry %+v", en)
	}
}
