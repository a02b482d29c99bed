package sim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/relaydriver"
	"github.com/millrace/watermill-outbox/internal/sim"
	"github.com/millrace/watermill-outbox/partitioning"
	"github.com/millrace/watermill-outbox/relay"
)

// The WAL model against PostgreSQL: the same transactions, published in
// the log-based mode on PostgreSQL and committed to the model's WAL, are
// relayed by the relay package's code — on PostgreSQL's slot and tables,
// and on the model — and the two logs must be equal: the same messages
// under the same seqs, in commit order per partition, through appends of
// one statement (small batches) and with COPY (large payloads).
func TestWALModelIsPostgreSQL(t *testing.T) {
	ctx := outboxtest.Ctx(t)
	b := outboxtest.Setup(t)
	b.Register(pinTopic, pinParts)
	model := sim.NewWALModel(b.Schema)
	total, txns := relayOnBoth(t, b, model)

	var want, got []string
	for p := range pinParts {
		rows, err := b.Pool.Query(ctx, `SELECT seq, uuid, coalesce(partition_key, '') FROM `+b.Schema+`.log WHERE topic = $1 AND partition = $2 ORDER BY seq`, pinTopic, p)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var e sim.LogEntry
			if err := rows.Scan(&e.Seq, &e.UUID, &e.Key); err != nil {
				t.Fatal(err)
			}
			want = append(want, fmt.Sprintf("partition %d: %+v", p, e))
		}
		rows.Close()
		for _, e := range model.Log(p) {
			got = append(got, fmt.Sprintf("partition %d: %+v", p, e))
		}
	}
	if diff := compareLines(want, got); diff != "" {
		t.Fatalf("the relay on the WAL model numbered the log otherwise than on PostgreSQL:\n%s", diff)
	}
	t.Logf("%d messages in %d transactions: the two logs agree", total, txns)
}

// The same for a forwarder-only topic: the relay puts its messages into
// pending, on PostgreSQL and on the model, in the same order (ids in
// commit order), and neither log gets any.
func TestWALModelForwardOnlyIsPostgreSQL(t *testing.T) {
	ctx := outboxtest.Ctx(t)
	b := outboxtest.Setup(t)
	if err := outbox.RegisterTopic(ctx, b.Pool, b.Schema, pinTopic, pinParts, outbox.ForwardOnly()); err != nil {
		t.Fatal(err)
	}
	model := sim.NewWALModel(b.Schema)
	model.ForwardOnly()
	total, txns := relayOnBoth(t, b, model)

	var want []string
	rows, err := b.Pool.Query(ctx, `SELECT partition, uuid, coalesce(partition_key, '') FROM `+b.Schema+`.pending WHERE topic = $1 ORDER BY id`, pinTopic)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p int
		var u, k string
		if err := rows.Scan(&p, &u, &k); err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("%d:%s:%s", p, u, k))
	}
	rows.Close()
	if diff := compareLines(want, model.PendingRows()); diff != "" {
		t.Fatalf("the relay on the WAL model put pending otherwise than on PostgreSQL:\n%s", diff)
	}
	if n := b.Rows("log"); n != 0 {
		t.Fatalf("PostgreSQL's log holds %d rows of a forwarder-only topic", n)
	}
	for p := range pinParts {
		if n := len(model.Log(p)); n != 0 {
			t.Fatalf("the model's log holds %d rows of partition %d", n, p)
		}
	}
	t.Logf("%d messages in %d transactions: the two pendings agree", total, txns)
}

// relayOnBoth publishes the same transactions in the log-based mode on
// PostgreSQL (b) and into model's WAL, and runs the relay package's code
// on each until everything is appended (into the log, or pending for a
// forwarder-only topic). It returns the messages and transactions.
func relayOnBoth(t *testing.T, b *outboxtest.Bundle, model *sim.WALModel) (total, transactions int) {
	t.Helper()
	ctx := outboxtest.Ctx(t)
	if err := relay.CreateSlot(ctx, b.Pool, b.Schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.DropSlot(context.Background(), b.Pool, b.Schema, true) })
	pub := b.Publisher(func(c *outbox.PublisherConfig) { c.Mode = outbox.ModeWAL })

	// Transactions of 1 to 5 messages over the partitions, some with a
	// payload of 2 KiB (appended with COPY, the payload in bodies).
	var txns [][]sim.WALMessage
	total = 0
	for i := range 30 {
		var msgs []sim.WALMessage
		for j := range 1 + i%5 {
			key := fmt.Sprintf("key-%d", (i*7+j)%6)
			p, _ := partitioning.Murmur2{}.Partition(key, pinParts)
			payload := []byte(fmt.Sprintf("m-%d-%d", i, j))
			if (i+j)%11 == 0 {
				payload = make([]byte, 2048)
			}
			msgs = append(msgs, sim.WALMessage{Partition: p, Key: key, UUID: fmt.Sprintf("m-%d-%d", i, j), Payload: payload})
		}
		txns = append(txns, msgs)
		total += len(msgs)
	}
	for _, msgs := range txns {
		// One call, one transaction of its own (OwnTransaction).
		var batch []*message.Message
		for _, m := range msgs {
			msg := outboxtest.Keyed(m.UUID, m.Key, 0, "")
			msg.Payload = m.Payload
			batch = append(batch, msg)
		}
		if err := pub.Publish(pinTopic, batch...); err != nil {
			t.Fatal(err)
		}
		model.Commit(msgs...)
	}

	cfg := relay.Config{Schema: b.Schema, Pool: b.Pool, MaxBatch: 7, MinAppendInterval: -1, WarnRetainedWAL: -1, DisableNotify: true, TakeoverTimeout: 10 * time.Second, Instance: "pin"}
	real, err := relay.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pool = nil
	run, err := relaydriver.Run(cfg, watermill.NopLogger{}, model.Backend(), nil)
	if err != nil {
		t.Fatal(err)
	}
	relayUntil(t, "PostgreSQL", real.Run, func() int {
		return int(b.Int("SELECT count(*) FROM "+b.Schema+".log") + b.Int("SELECT count(*) FROM "+b.Schema+".pending"))
	}, total)
	relayUntil(t, "the model", run, func() int {
		n := len(model.PendingRows())
		for p := range pinParts {
			n += len(model.Log(p))
		}
		return n
	}, total)
	return total, len(txns)
}

// relayUntil runs a relay until count says the log holds want messages.
func relayUntil(t *testing.T, where string, run func(context.Context) error, count func() int, want int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	outboxtest.WaitFor(t, "the relay on "+where+" appended every message", 2*time.Minute, func() bool { return count() >= want })
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the relay on %s: %v", where, err)
	}
	if n := count(); n != want {
		t.Fatalf("the relay on %s appended %d messages, %d were committed", where, n, want)
	}
}
