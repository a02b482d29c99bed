package kafka_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/direct"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/relay"
)

// registerForwardOnly registers topic in e's schema as forwarder-only.
func registerForwardOnly(t *testing.T, e fwdtest.Env, topic string, partitions int) {
	t.Helper()
	if err := outbox.RegisterTopic(outboxtest.Ctx(t), e.Pool, e.Schema, topic, partitions, outbox.ForwardOnly()); err != nil {
		t.Fatal(err)
	}
}

// A forwarder-only topic (outbox.ForwardOnly) goes from pending to Kafka
// in one step: two instances share its 8 partitions, every message arrives
// once in key order with the stable id of a sequenced topic, and nothing
// was ever written to the log (nor left in pending or bodies).
func TestForwardOnlyTopicGoesToKafkaWithoutTheLog(t *testing.T) {
	e := fwdtest.NewEnv(t)
	registerForwardOnly(t, e, "orders", 8)
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 8, nil)
	mapping := func(cfg *forwarder.Config) { cfg.TargetTopic = func(string) string { return topic } }
	a := fwdtest.StartForwarder(t, e, nil, newTarget(t, c, false), []string{"orders"}, mapping)
	b := fwdtest.StartForwarder(t, e, nil, newTarget(t, c, false), []string{"orders"}, mapping)

	pub := fwdtest.NewPublisher(t, e)
	for range 10 {
		pub.Round("orders", 20, func(m *message.Message) {
			if m.Metadata.Get("n") == "3" {
				m.Payload = []byte(strings.Repeat("x", 2000)) // into bodies at publish
			}
		})
	}
	r := &fwdtest.Received{}
	c.Consume(t, topic, r)
	outboxtest.WaitFor(t, "every message forwarded", 2*time.Minute, func() bool {
		return a.Stats().Messages+b.Stats().Messages >= int64(pub.Count()) && r.Distinct() == pub.Count()
	})
	if dups := r.Check(t, pub.Snapshot(), nil); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
	for _, g := range r.Messages() {
		if g.BrokerPartition != g.OutboxPartition {
			t.Fatalf("%s: outbox partition %d went to Kafka partition %d", g.ID, g.OutboxPartition, g.BrokerPartition)
		}
		if g.Metadata.Get(direct.MetadataPendingID) == "" {
			t.Fatalf("%s arrived without %s", g.ID, direct.MetadataPendingID)
		}
	}
	for _, table := range []string{"log", "pending", "bodies"} {
		if n := e.Rows(table); n != 0 {
			t.Errorf("%s holds %d rows, want none", table, n)
		}
	}
	if n := e.Int(`SELECT sum(last_seq) FROM ` + e.Schema + `.partitions WHERE topic = 'orders'`); n != int64(pub.Count()) {
		t.Errorf("partitions.last_seq sums to %d, want %d", n, pub.Count())
	}
	if n := e.Int(`SELECT sum(seq) FROM ` + e.Schema + `.cursors WHERE topic = 'orders'`); n != int64(pub.Count()) {
		t.Errorf("the cursors sum to %d, want %d", n, pub.Count())
	}
}

// In the log-based mode a forwarder-only topic skips the log too: the
// relay puts what Publishers in ModeWAL committed into pending, in commit
// order, and two forwarders take it from there to Kafka, each message once
// in key order (a large payload among them); nothing is left in the log,
// pending or bodies.
func TestForwardOnlyTopicInTheLogBasedMode(t *testing.T) {
	b, _ := outboxtest.OwnCluster(t, map[string]string{"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4", "wal_writer_delay": "10ms"}, "fwdonlywal")
	e := fwdtest.EnvOf(b)
	registerForwardOnly(t, e, "orders", 4)
	ctx := outboxtest.Ctx(t)
	if err := relay.CreateSlot(ctx, e.Pool, e.Schema); err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Config{Schema: e.Schema, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = r.Close()
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
		_ = relay.DropSlot(context.Background(), e.Pool, e.Schema, true)
	})
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 4, nil)
	mapping := func(cfg *forwarder.Config) { cfg.TargetTopic = func(string) string { return topic } }
	a := fwdtest.StartForwarder(t, e, nil, newTarget(t, c, false), []string{"orders"}, mapping)
	f := fwdtest.StartForwarder(t, e, nil, newTarget(t, c, false), []string{"orders"}, mapping)

	pub := fwdtest.NewPublisherMode(t, e, outbox.ModeWAL)
	for range 10 {
		pub.Round("orders", 12, func(m *message.Message) {
			if m.Metadata.Get("n") == "3" {
				m.Payload = []byte(strings.Repeat("x", 2000))
			}
		})
	}
	got := &fwdtest.Received{}
	c.Consume(t, topic, got)
	outboxtest.WaitFor(t, "every message forwarded", 2*time.Minute, func() bool {
		return a.Stats().Messages+f.Stats().Messages >= int64(pub.Count()) && got.Distinct() == pub.Count()
	})
	if dups := got.Check(t, pub.Snapshot(), nil); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
	for _, table := range []string{"log", "pending", "bodies"} {
		if n := e.Rows(table); n != 0 {
			t.Errorf("%s holds %d rows, want none", table, n)
		}
	}
	if n := r.Stats().Appended; n != int64(pub.Count()) {
		t.Errorf("the relay appended %d messages, want %d", n, pub.Count())
	}
	if n := e.Int(`SELECT sum(seq) FROM ` + e.Schema + `.cursors WHERE topic = 'orders'`); n != int64(pub.Count()) {
		t.Errorf("the cursors sum to %d, want %d", n, pub.Count())
	}
}

// A previous owner read pending before the transaction of message 1
// committed: it numbered messages 2 and 3 as seqs 1 and 2, committed them
// to Kafka, and died before it recorded them. The next owner reads pending
// again and finds 1, 2 and 3: numbered anew, 1 would be seq 1. Its tail
// read finds seqs 1 and 2 in Kafka with the pending ids of 2 and 3, so
// those leave pending, the cursor moves to 2, and message 1 goes as seq 3:
// each message in Kafka once, in commit order. (Skipping by seq alone
// would lose message 1 and send message 3 twice.)
func TestForwardOnlyTakeoverRecordsWhatAPreviousOwnerCommitted(t *testing.T) {
	e := fwdtest.NewEnv(t)
	registerForwardOnly(t, e, "orders", 1)
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 1, nil)
	ctx := outboxtest.Ctx(t)

	uuids := make([]string, 3)
	for i := range uuids {
		uuids[i] = watermill.NewUUID()
		m := message.NewMessage(uuids[i], []byte("m"+strconv.Itoa(i+1)))
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "key-"+strconv.Itoa(i))
		e.Publish("orders", m)
	}
	type row struct {
		id   int64
		uuid string
	}
	var rows []row
	q, err := e.Pool.Query(ctx, `SELECT id, uuid FROM `+e.Schema+`.pending ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for q.Next() {
		var r row
		if err := q.Scan(&r.id, &r.uuid); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	if q.Close(); len(rows) != 3 {
		t.Fatalf("pending holds %d rows, want 3", len(rows))
	}
	incarnation, err := direct.Incarnation(ctx, e.Pool, e.Schema, "orders")
	if err != nil {
		t.Fatal(err)
	}

	// The previous owner's round: rows 2 and 3 as seqs 1 and 2.
	prev := newTarget(t, c, false)
	var batch []*message.Message
	for i, r := range rows[1:] {
		seq := int64(i + 1)
		m := message.NewMessage(r.uuid, []byte("m"))
		m.Metadata.Set(outbox.MetadataTopic, "orders")
		m.Metadata.Set(outbox.MetadataPartition, "0")
		m.Metadata.Set(outbox.MetadataSeq, strconv.FormatInt(seq, 10))
		m.Metadata.Set(outbox.MetadataID, consumer.StableID("orders", 0, seq))
		m.Metadata.Set(outbox.MetadataIncarnation, incarnation)
		m.Metadata.Set(direct.MetadataPendingID, strconv.FormatInt(r.id, 10))
		batch = append(batch, m)
	}
	if done, err := prev.Send(ctx, topic, underLease(batch, 1, &writerRecord{})); done != 2 || err != nil {
		t.Fatalf("the previous owner's send: done %d, %v", done, err)
	}

	fwdtest.StartForwarder(t, e, nil, newTarget(t, c, false), []string{"orders"}, func(cfg *forwarder.Config) {
		cfg.TargetTopic = func(string) string { return topic }
	})
	outboxtest.WaitFor(t, "the rest forwarded", time.Minute, func() bool { return e.Rows("pending") == 0 })

	got := c.ReadCommitted(t, topic)
	want := []struct{ uuid, id string }{
		{rows[1].uuid, "orders/0/1"}, {rows[2].uuid, "orders/0/2"}, {rows[0].uuid, "orders/0/3"},
	}
	if len(got) != len(want) {
		var ids []string
		for _, r := range got {
			ids = append(ids, kafkatest.Header(r, outbox.MetadataID))
		}
		t.Fatalf("Kafka holds %d records %v, want %d", len(got), ids, len(want))
	}
	for i, w := range want {
		if u, id := kafkatest.Header(got[i], "_watermill_message_uuid"), kafkatest.Header(got[i], outbox.MetadataID); u != w.uuid || id != w.id {
			t.Fatalf("record %d: %s as %s, want %s as %s", i, u, id, w.uuid, w.id)
		}
	}
	if seq, _, _ := e.Cursor(forwarder.DefaultConsumerGroup, "orders", 0); seq != 3 {
		t.Fatalf("cursor at %d, want 3", seq)
	}
}

// A message Kafka can never take (larger than the topic's
// max.message.bytes) is dead-lettered in the round's transaction with its
// seq; the messages around it go on, and pending empties.
func TestForwardOnlyPoisonIsDeadLettered(t *testing.T) {
	e := fwdtest.NewEnv(t)
	registerForwardOnly(t, e, "orders", 1)
	c := kafkatest.New(t)
	topic := smallTopic(t, c, 1)
	fwd := fwdtest.StartForwarder(t, e, nil, newTarget(t, c, false), []string{"orders"}, func(cfg *forwarder.Config) {
		cfg.TargetTopic = func(string) string { return topic }
	})
	var msgs []*message.Message
	for i := range 5 {
		payload := []byte("small")
		if i == 2 {
			payload = make([]byte, 2*topicMaxBytes)
		}
		msgs = append(msgs, message.NewMessage(watermill.NewUUID(), payload))
	}
	e.Publish("orders", msgs...)
	outboxtest.WaitFor(t, "everything forwarded or dead-lettered", time.Minute, func() bool { return e.Rows("pending") == 0 })
	dead := e.DeadLettered(t)
	if len(dead) != 1 || dead[msgs[2].UUID] == "" {
		t.Fatalf("dead letters %v, want only %s", dead, msgs[2].UUID)
	}
	var ids []string
	for _, r := range c.ReadCommitted(t, topic) {
		ids = append(ids, kafkatest.Header(r, outbox.MetadataID))
	}
	if strings.Join(ids, " ") != "orders/0/1 orders/0/2 orders/0/4 orders/0/5" {
		t.Fatalf("Kafka holds %v, want seqs 1, 2, 4 and 5", ids)
	}
	if s := fwd.Stats(); s.Messages != 4 || s.Rejected != 1 {
		t.Fatalf("stats %+v, want 4 messages and 1 rejected", s)
	}
}

// A Forwarder refuses a forwarder-only topic it cannot forward: through a
// target other than the exactly-once Kafka target, or with middleware.
func TestForwardOnlyNeedsTheExactlyOnceKafkaTarget(t *testing.T) {
	e := fwdtest.NewEnv(t)
	registerForwardOnly(t, e, "orders", 1)
	c := kafkatest.New(t)
	for name, edit := range map[string]func(*forwarder.Config){
		"at least once": func(cfg *forwarder.Config) { cfg.Target = newTarget(t, c, true) },
		"another target": func(cfg *forwarder.Config) {
			cfg.Target = forwarder.TargetFunc(func(context.Context, string, []*message.Message) (int, error) { return 0, nil })
		},
		"middleware": func(cfg *forwarder.Config) {
			cfg.Middlewares = []message.HandlerMiddleware{func(h message.HandlerFunc) message.HandlerFunc { return h }}
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := forwarder.Config{
				Subscriber: outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, Tuning: outboxtest.FastTuning()},
				Topics:     []string{"orders"},
				Target:     newTarget(t, c, false),
			}
			edit(&cfg)
			fwd, err := forwarder.NewForwarder(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = fwd.Run(outboxtest.Ctx(t))
			if !strings.Contains(err.Error(), "forwarder-only") {
				t.Fatalf("Run: %v, want it refused as forwarder-only", err)
			}
			var ce *outboxtype.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Run: %T %v, want a *ConfigError", err, err)
			}
		})
	}
}

// On the short path a delayed message waits in pending until it is due,
// and holds the later messages of its key behind it, as on the log path;
// a tombstone arrives as a record with its key and a null value.
func TestForwardOnlyDelaysAndTombstones(t *testing.T) {
	e := fwdtest.NewEnv(t)
	registerForwardOnly(t, e, "orders", 1)
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", 1, nil)
	fwdtest.StartForwarder(t, e, nil, newTarget(t, c, false), []string{"orders"}, func(cfg *forwarder.Config) {
		cfg.TargetTopic = func(string) string { return topic }
	})
	keyed := func(key, payload string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte(payload))
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
		return m
	}
	due := time.Now().Add(2 * time.Second)
	delayed := keyed("a", "later")
	if err := outbox.DeliverAt(delayed, due); err != nil {
		t.Fatal(err)
	}
	behind := keyed("a", "behind the delayed one")
	other := keyed("b", "another key")
	tomb := keyed("c", "")
	tomb.Payload = nil
	if err := outbox.Tombstone(tomb); err != nil {
		t.Fatal(err)
	}
	e.Publish("orders", delayed, behind, other, tomb)
	outboxtest.WaitFor(t, "the undelayed key's messages forwarded", time.Minute, func() bool { return e.Rows("pending") == 2 })
	// Read before the delayed message is due (on a machine slow enough to
	// get here after it, the end below still checks the order).
	if n := len(c.ReadCommitted(t, topic)); time.Now().Before(due) && n != 2 {
		t.Fatalf("Kafka holds %d records before the delayed message is due, want 2 (the other key's and the tombstone)", n)
	}
	outboxtest.WaitFor(t, "the delayed key's messages forwarded", time.Minute, func() bool { return e.Rows("pending") == 0 })
	if time.Now().Before(due) {
		t.Fatalf("the delayed message left pending before it was due")
	}
	got := c.ReadCommitted(t, topic)
	var order []string
	for _, r := range got {
		order = append(order, kafkatest.Header(r, kafka.UUIDHeaderKey))
		if string(r.Key) == "c" && (r.Value != nil || kafkatest.Header(r, outbox.MetadataTombstone) != "true") {
			t.Fatalf("the tombstone's record: value %#v, header %q; want a null value and the mark", r.Value, kafkatest.Header(r, outbox.MetadataTombstone))
		}
	}
	want := []string{other.UUID, tomb.UUID, delayed.UUID, behind.UUID}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("Kafka holds %v, want %v (the delayed message and the one behind it last, in their order)", order, want)
	}
}
