package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/retention"
)

// dedupKeys lists the dedup rows of topic, by key.
func (e env) dedupKeys(t *testing.T, topic string) []string {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(), "SELECT dedup_key FROM "+e.Schema+".dedup_keys WHERE topic = $1 ORDER BY dedup_key", topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

// Each pass deletes the dedup keys whose window is over, in chunks (More
// while a pass deleted MaxChunksPerVisit full ones), and keeps the others;
// a key being claimed again by an open transaction is skipped without
// waiting, and keeps the window that transaction gives it.
func TestVacuumDeletesExpiredDedupKeys(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.Register("orders", 1)
	e.Register("clicks", 1)
	pub := e.Publisher(func(c *outbox.PublisherConfig) {
		c.DedupWindows = map[string]time.Duration{"clicks": time.Millisecond}
	})
	publish := func(topic, uuid, key string) *message.Message {
		t.Helper()
		m := message.NewMessage(uuid, nil)
		if err := outbox.DedupKey(m, key); err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		publish("clicks", "click-"+k, k)
		publish("orders", "order-"+k, k)
	}
	time.Sleep(5 * time.Millisecond) // the clicks' windows are over

	// An open transaction claims click key "a" again: its row is locked.
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
	// The default window, 24 hours.
	txPub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: e.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	again := message.NewMessage("click-a-again", nil)
	if err := outbox.DedupKey(again, "a"); err != nil {
		t.Fatal(err)
	}
	if err := txPub.Publish("clicks", again); err != nil || outbox.Deduplicated(again) {
		t.Fatalf("claiming an expired key again: %v, deduplicated %v", err, outbox.Deduplicated(again))
	}

	v := e.vacuum(t, retention.Config{ChunkSize: 2, MaxChunksPerVisit: 1})
	passCtx, cancel := context.WithTimeout(ctx, 10*time.Second) // it must not wait for tx
	defer cancel()
	stats, err := v.VacuumOnce(passCtx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.DedupKeys != 2 || !stats.More {
		t.Fatalf("first pass: %+v, want 2 dedup keys deleted and More", stats)
	}
	stats, err = v.VacuumOnce(passCtx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.DedupKeys != 2 || !stats.More {
		t.Fatalf("second pass: %+v, want 2 more and More", stats)
	}
	stats, err = v.VacuumOnce(passCtx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.DedupKeys != 0 || stats.More {
		t.Fatalf("third pass: %+v, want nothing left (the locked key skipped)", stats)
	}
	if got := v.Stats().DedupKeys; got != 4 {
		t.Fatalf("Stats().DedupKeys = %d, want 4", got)
	}
	if got := e.dedupKeys(t, "clicks"); len(got) != 1 || got[0] != "a" {
		t.Fatalf("clicks' keys left %v, want the one being claimed again", got)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := v.VacuumOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.dedupKeys(t, "clicks"); len(got) != 1 {
		t.Fatalf("clicks' keys after the claim committed: %v, want a, with its new window", got)
	}
	if got := e.dedupKeys(t, "orders"); len(got) != 5 {
		t.Fatalf("orders' keys %v: within their window, all stay", got)
	}

	// A key deleted by retention is free: the next message is stored.
	m := publish("clicks", "click-b-again", "b")
	if outbox.Deduplicated(m) {
		t.Fatal("a key retention deleted is still taken")
	}
	if n := e.Int("SELECT count(*) FROM "+e.Schema+".pending WHERE uuid = $1", "click-b-again"); n != 1 {
		t.Fatalf("click-b-again stored %d times", n)
	}
}
