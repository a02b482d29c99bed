package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// deduped is a message with dedup key key (none when "").
func deduped(t testing.TB, uuid, key string) *message.Message {
	t.Helper()
	m := message.NewMessage(uuid, []byte("payload of "+uuid))
	if key != "" {
		if err := outbox.DedupKey(m, key); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// pendingUUIDs lists the uuids written into pending for topic, in id order.
func pendingUUIDs(t testing.TB, b *outboxtest.Bundle, topic string) []string {
	t.Helper()
	rows, err := b.Pool.Query(outboxtest.Ctx(t), "SELECT uuid FROM "+b.Schema+".pending WHERE topic = $1 ORDER BY id", topic)
	if err != nil {
		t.Fatal(err)
	}
	uuids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return uuids
}

// skippedOf lists the uuids of msgs that Deduplicated reports.
func skippedOf(msgs ...*message.Message) []string {
	var out []string
	for _, m := range msgs {
		if outbox.Deduplicated(m) {
			out = append(out, m.UUID)
		}
	}
	return out
}

// A second message with the same topic and key is not stored, and Publish
// says so through Deduplicated: in a later transaction, in a later Publish
// of the same transaction, and within one call (the first wins). Another
// topic, and messages without a key, are not affected; neither are calls
// of one message, which take the same statement.
func TestDedupKeyStoresOneMessagePerKeyAndTopic(t *testing.T) {
	t.Parallel()
	b := outboxtest.Setup(t)
	b.Register("orders", 4)
	b.Register("invoices", 1)
	pub := b.Publisher(nil)

	first := deduped(t, "first", "order-1")
	if err := pub.Publish("orders", first); err != nil || outbox.Deduplicated(first) {
		t.Fatalf("first publish: %v, deduplicated %v", err, outbox.Deduplicated(first))
	}
	again := deduped(t, "again", "order-1")
	if err := pub.Publish("orders", again); err != nil || !outbox.Deduplicated(again) {
		t.Fatalf("second publish of the key: %v, deduplicated %v; want nil and true", err, outbox.Deduplicated(again))
	}
	other := deduped(t, "other-topic", "order-1")
	if err := pub.Publish("invoices", other); err != nil || outbox.Deduplicated(other) {
		t.Fatalf("the key on another topic: %v, deduplicated %v", err, outbox.Deduplicated(other))
	}

	// One call: repeats within it, a taken key, new keys, no key.
	call := []*message.Message{
		deduped(t, "a", "order-2"), deduped(t, "b", "order-2"), deduped(t, "c", "order-1"),
		deduped(t, "d", ""), deduped(t, "e", "order-3"), deduped(t, "f", "order-3"), deduped(t, "g", ""),
	}
	if err := pub.Publish("orders", call...); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(skippedOf(call...), ","), "b,c,f"; got != want {
		t.Fatalf("deduplicated in the call: %s, want %s", got, want)
	}

	// Two calls in one transaction: the second sees the first's claim.
	tx, err := b.Pool.Begin(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	txPub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: b.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	one, two := deduped(t, "tx-1", "order-4"), deduped(t, "tx-2", "order-4")
	if err := txPub.Publish("orders", one); err != nil {
		t.Fatal(err)
	}
	if err := txPub.Publish("orders", two); err != nil || outbox.Deduplicated(one) || !outbox.Deduplicated(two) {
		t.Fatalf("two calls in one transaction: %v, deduplicated %v %v; want false true", err, outbox.Deduplicated(one), outbox.Deduplicated(two))
	}
	if err := tx.Commit(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}

	if got, want := strings.Join(pendingUUIDs(t, b, "orders"), ","), "first,a,d,e,g,tx-1"; got != want {
		t.Fatalf("stored: %s, want %s", got, want)
	}
	if got := pendingUUIDs(t, b, "invoices"); len(got) != 1 {
		t.Fatalf("invoices stored %v", got)
	}
	if n := b.Int("SELECT count(*) FROM " + b.Schema + ".dedup_keys"); n != 5 {
		t.Fatalf("%d dedup rows, want 5 (orders: order-1..4, invoices: order-1)", n)
	}
	// The key travels with the message; the mark does not.
	var md map[string]string
	if err := b.Pool.QueryRow(outboxtest.Ctx(t), "SELECT metadata FROM "+b.Schema+".pending WHERE uuid = 'first'").Scan(&md); err != nil {
		t.Fatal(err)
	}
	if len(md) != 1 || md[outbox.DedupKeyMetadata] != "order-1" {
		t.Fatalf("stored metadata %v, want only the dedup key", md)
	}

	// Publishing a skipped message again (its key still taken) keeps it
	// marked; one stored later (its key freed) is unmarked.
	if err := pub.Publish("orders", again); err != nil || !outbox.Deduplicated(again) {
		t.Fatalf("again: %v, %v", err, outbox.Deduplicated(again))
	}
	b.Exec("DELETE FROM " + b.Schema + ".dedup_keys WHERE dedup_key = 'order-1'")
	if err := pub.Publish("orders", again); err != nil || outbox.Deduplicated(again) {
		t.Fatalf("again after the key was freed: %v, deduplicated %v", err, outbox.Deduplicated(again))
	}
}

// The window: a key is taken for the topic's window from the publish that
// claimed it (DedupWindows overrides DedupWindow), and can be claimed
// again once it is over, without waiting for retention. The window's end
// is the database's time: the test moves the key's expiry into the past
// (as if the window had gone by) rather than wait for it, so that a busy
// machine cannot let the window pass before the publish meant to fall
// within it.
func TestDedupWindowIsPerTopic(t *testing.T) {
	t.Parallel()
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	b.Register("clicks", 1)
	pub := b.Publisher(func(c *outbox.PublisherConfig) {
		c.DedupWindow = time.Hour
		c.DedupWindows = map[string]time.Duration{"clicks": 10 * time.Minute}
	})
	if err := pub.Publish("orders", deduped(t, "o1", "k")); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("clicks", deduped(t, "c1", "k")); err != nil {
		t.Fatal(err)
	}
	window := func(topic string) time.Duration {
		var us int64
		if err := b.Pool.QueryRow(outboxtest.Ctx(t), "SELECT (extract(epoch FROM expires_at - now()) * 1e6)::int8 FROM "+b.Schema+".dedup_keys WHERE topic = $1", topic).Scan(&us); err != nil {
			t.Fatal(err)
		}
		return time.Duration(us) * time.Microsecond
	}
	if w := window("orders"); w < 59*time.Minute || w > time.Hour {
		t.Fatalf("orders' key expires in %v, want about an hour", w)
	}
	if w := window("clicks"); w < 9*time.Minute || w > 10*time.Minute {
		t.Fatalf("clicks' key expires in %v, want about 10 minutes", w)
	}
	c2 := deduped(t, "c2", "k")
	if err := pub.Publish("clicks", c2); err != nil || !outbox.Deduplicated(c2) {
		t.Fatalf("within the window: %v, deduplicated %v", err, outbox.Deduplicated(c2))
	}
	// Ten minutes on, by the keys' clock: clicks' window is over,
	// orders' is not.
	b.Exec("UPDATE " + b.Schema + ".dedup_keys SET expires_at = expires_at - interval '10 minutes'")
	c3 := deduped(t, "c3", "k")
	if err := pub.Publish("clicks", c3); err != nil || outbox.Deduplicated(c3) {
		t.Fatalf("after the window: %v, deduplicated %v", err, outbox.Deduplicated(c3))
	}
	o2 := deduped(t, "o2", "k")
	if err := pub.Publish("orders", o2); err != nil || !outbox.Deduplicated(o2) {
		t.Fatalf("orders within its window: %v, deduplicated %v", err, outbox.Deduplicated(o2))
	}
	if got := strings.Join(pendingUUIDs(t, b, "clicks"), ","); got != "c1,c3" {
		t.Fatalf("clicks stored %s, want c1,c3", got)
	}
}

// Two transactions on one key: the second waits for the first, and skips
// its message if the first commits, or stores it if the first rolls back
// (the claim goes with the rollback). The same for a key whose window was
// over, claimed again by an update of its row.
func TestDedupConcurrentClaimWaitsForTheFirstTransaction(t *testing.T) {
	t.Parallel()
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: b.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := outboxtest.Ctx(t)
	for _, c := range []struct {
		name    string
		expired bool // the key's row exists, its window over
		commit  bool
	}{{"commit", false, true}, {"rollback", false, false}, {"expired-commit", true, true}, {"expired-rollback", true, false}} {
		t.Run(c.name, func(t *testing.T) {
			key := "key-" + c.name
			if c.expired {
				b.Exec("INSERT INTO "+b.Schema+".dedup_keys (topic, dedup_key, expires_at) VALUES ('orders', $1, now() - interval '1 second')", key)
			}
			first, err := b.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
			m1 := deduped(t, c.name+"-first", key)
			m1.SetContext(outbox.WithTx(ctx, first))
			if err := pub.Publish("orders", m1); err != nil || outbox.Deduplicated(m1) {
				t.Fatalf("first: %v, deduplicated %v", err, outbox.Deduplicated(m1))
			}

			m2 := deduped(t, c.name+"-second", key)
			done := make(chan error, 1)
			go func() {
				done <- pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
					m2.SetContext(outbox.WithTx(ctx, tx))
					return pub.Publish("orders", m2)
				})
			}()
			outboxtest.WaitFor(t, "the second transaction to wait for the first's claim", 30*time.Second, func() bool {
				return b.Int("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0", b.Schema) > 0
			})
			select {
			case err := <-done:
				t.Fatalf("the second publish returned (%v) while the first transaction was open", err)
			default:
			}
			if c.commit {
				err = first.Commit(ctx)
			} else {
				err = first.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if outbox.Deduplicated(m2) != c.commit {
				t.Fatalf("second deduplicated: %v, want %v", outbox.Deduplicated(m2), c.commit)
			}
			want := m2.UUID
			if c.commit {
				want = m1.UUID
			}
			if n := b.Int("SELECT count(*) FROM "+b.Schema+".pending WHERE uuid = $1", want); n != 1 {
				t.Fatalf("%s stored %d times, want once", want, n)
			}
			if n := b.Int("SELECT count(*) FROM "+b.Schema+".dedup_keys WHERE dedup_key = $1 AND expires_at > now()", key); n != 1 {
				t.Fatalf("%d live claims of %s, want 1", n, key)
			}
		})
	}
}

// Bad input: DedupKey refuses a nil message and bad keys with
// ErrInvalidArgument and leaves the message as it was; a bad key set
// directly in the metadata is refused by Publish with a *MessageError
// before anything is written; impossible windows are *ConfigErrors.
func TestDedupBadInputIsTyped(t *testing.T) {
	t.Parallel()
	if err := outbox.DedupKey(nil, "k"); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("DedupKey(nil): %v", err)
	}
	for name, key := range map[string]string{
		"empty": "", "NUL": "a\x00b", "invalid UTF-8": "a\xffb", "too long": strings.Repeat("k", outbox.MaxDedupKeyBytes+1),
		"a line feed": "order-1\norder-2", "an escape": "\x1b[31mred", "a right-to-left override": "order\u202e1", "a zero-width space": "order\u200b1",
	} {
		m := message.NewMessage("m", nil)
		if err := outbox.DedupKey(m, key); !errors.Is(err, outbox.ErrInvalidArgument) || len(m.Metadata) != 0 {
			t.Errorf("DedupKey(%s): %v, metadata %v", name, err, m.Metadata)
		}
	}
	if err := outbox.DedupKey(&message.Message{UUID: "zero"}, strings.Repeat("k", outbox.MaxDedupKeyBytes)); err != nil {
		t.Errorf("DedupKey on a message without metadata map, longest key: %v", err)
	}
	if outbox.Deduplicated(nil) || outbox.Deduplicated(message.NewMessage("m", nil)) {
		t.Error("Deduplicated of nil or of a message never published")
	}

	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	pub := b.Publisher(nil)
	for name, key := range map[string]string{"empty": "", "NUL": "a\x00b", "too long": strings.Repeat("k", outbox.MaxDedupKeyBytes+1)} {
		good := deduped(t, "good-"+name, "good-"+name)
		bad := message.NewMessage("bad-"+name, nil)
		bad.Metadata.Set(outbox.DedupKeyMetadata, key)
		var me *outboxtype.MessageError
		if err := pub.Publish("orders", good, bad); !errors.As(err, &me) || !errors.Is(err, outbox.ErrInvalidMessage) || me.UUID != bad.UUID {
			t.Errorf("Publish with a %s dedup key in the metadata: %v, want a *MessageError naming %s", name, err, bad.UUID)
		}
	}
	if n := b.Int("SELECT count(*) FROM " + b.Schema + ".pending"); n != 0 {
		t.Errorf("%d messages written by refused calls", n)
	}
	if n := b.Int("SELECT count(*) FROM " + b.Schema + ".dedup_keys"); n != 0 {
		t.Errorf("%d keys claimed by refused calls", n)
	}

	for name, cfg := range map[string]outbox.PublisherConfig{
		"DedupWindow":            {DedupWindow: -time.Second},
		"DedupWindow below 1µs":  {DedupWindow: time.Nanosecond},
		"DedupWindows[orders]":   {DedupWindows: map[string]time.Duration{"orders": 0}},
		"DedupWindows[negative]": {DedupWindows: map[string]time.Duration{"orders": -time.Hour}},
	} {
		var ce *outboxtype.ConfigError
		if err := cfg.Validate(); !errors.As(err, &ce) || !strings.HasPrefix(ce.Field, "DedupWindow") {
			t.Errorf("%s: %v, want a *ConfigError on DedupWindow(s)", name, err)
		}
	}
	if err := (outbox.PublisherConfig{DedupWindows: map[string]time.Duration{"bad topic": time.Hour}}).Validate(); !errors.Is(err, outbox.ErrInvalidName) {
		t.Errorf("DedupWindows with a bad topic name: %v, want ErrInvalidName", err)
	}
}

// A schema migrated by an older release, without dedup_keys: a call with
// dedup keys is refused as not migrated, naming Migrate; calls without
// keys work as before.
func TestDedupOnASchemaMigratedByAnOlderRelease(t *testing.T) {
	t.Parallel()
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	b.Exec("DROP TABLE " + b.Schema + ".dedup_keys")
	pub := b.Publisher(nil)
	if err := pub.Publish("orders", deduped(t, "plain", "")); err != nil {
		t.Fatal(err)
	}
	err := pub.Publish("orders", deduped(t, "keyed", "k"))
	if !errors.Is(err, outbox.ErrNotMigrated) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("publish with a key without dedup_keys: %v, want ErrNotMigrated", err)
	}
}

// Through database/sql (pgx's stdlib driver): the statement's arrays and
// its result read the same way.
func TestDedupThroughDatabaseSQL(t *testing.T) {
	t.Parallel()
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	db := stdlib.OpenDBFromPool(b.Pool)
	defer db.Close()
	ctx := outboxtest.Ctx(t)
	for _, want := range []bool{false, true} {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: b.Schema}, nil)
		if err != nil {
			t.Fatal(err)
		}
		msgs := []*message.Message{deduped(t, "keyed", "k"), deduped(t, "plain", "")}
		if err := pub.Publish("orders", msgs...); err != nil || outbox.Deduplicated(msgs[0]) != want || outbox.Deduplicated(msgs[1]) {
			t.Fatalf("publish through *sql.Tx: %v, deduplicated %v %v; want %v false", err, outbox.Deduplicated(msgs[0]), outbox.Deduplicated(msgs[1]), want)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(pendingUUIDs(t, b, "orders"), ","); got != "keyed,plain,plain" {
		t.Fatalf("stored %s", got)
	}
}
