package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
)

// dedupVariants publish the same messages as outbox-notify (the default
// Publisher), without dedup keys, with a new key each (every key claimed,
// every message stored), and with keys all taken already (every message
// left out).
var dedupVariants = []publishVariant{
	{name: "nokeys", setup: func(ctx context.Context, e *env, schema string) (*publishTarget, error) {
		return setupOutbox(ctx, e, schema, false)
	}},
	{name: "keys-new", setup: func(ctx context.Context, e *env, schema string) (*publishTarget, error) {
		return setupDedup(ctx, e, schema, func(m *message.Message) string { return "request-" + m.UUID })
	}},
	{name: "keys-taken", setup: func(ctx context.Context, e *env, schema string) (*publishTarget, error) {
		if _, err := setupOutbox(ctx, e, schema, true); err != nil { // (the schema, for the claims)
			return nil, err
		}
		if err := e.ddl(ctx, schema, `INSERT INTO {{s}}.dedup_keys (topic, dedup_key, expires_at)
			SELECT '`+topic+`', 'key-' || lpad(g::text, 4, '0'), now() + interval '1 day' FROM generate_series(0, 999) g`); err != nil {
			return nil, err
		}
		return setupDedup(ctx, e, schema, func(m *message.Message) string { return m.Metadata.Get(outbox.PublishPartitionKeyMetadata) })
	}},
}

// setupDedup is setupOutbox's Publisher with a dedup key on every message,
// key(msg).
func setupDedup(ctx context.Context, e *env, schema string, key func(*message.Message) string) (*publishTarget, error) {
	t, err := setupOutbox(ctx, e, schema, false)
	if err != nil {
		return nil, err
	}
	if err := e.ddl(ctx, schema, `ALTER TABLE {{s}}.dedup_keys SET (autovacuum_enabled = false)`); err != nil {
		return nil, err
	}
	publish := t.publish
	t.publish = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		for _, m := range msgs {
			if err := outbox.DedupKey(m, key(m)); err != nil {
				return err
			}
		}
		return publish(ctx, tx, msgs)
	}
	return t, nil
}

// BenchmarkPublishDedup measures what dedup keys (outbox.DedupKey) cost at
// 100 messages per transaction, as BenchmarkPublish does (one op is one
// message; BEGIN, one Publish, COMMIT from 4 goroutines): the default
// Publisher without keys, with a new key on every message (each claimed:
// a row and two index entries in dedup_keys besides the message), and with
// every key taken (nothing written but the claims' row locks).
func BenchmarkPublishDedup(b *testing.B) {
	e := newEnv(b, true)
	const perTx = 100
	var names []string
	for r := 0; r < *rounds; r++ {
		for _, v := range dedupVariants {
			b.Run(v.name, func(b *testing.B) { benchPublish(b, e, v, perTx) })
			if r == 0 {
				names = append(names, v.name)
			}
		}
	}
	printMedians(b.Name(), names, []string{"msgs/s", "WAL-B/msg", "cpu-us/msg"})
	for _, metric := range []string{"msgs/s", "cpu-us/msg"} {
		get := func(v string) (float64, bool) { return lookup(b.Name()+"/"+v, metric) }
		none, okN := get("nokeys")
		fresh, okF := get("keys-new")
		taken, okT := get("keys-taken")
		fmt.Printf("%s: ratio of medians of %s: keys-new/nokeys = %s, keys-taken/nokeys = %s\n",
			b.Name(), metric, ratio(fresh, none, okF, okN), ratio(taken, none, okT, okN))
	}
}

// The variants write what they should: every message with new keys, none
// with taken keys.
func TestSmokeDedup(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	for _, v := range dedupVariants {
		t.Run(v.name, func(t *testing.T) {
			schema, err := e.newSchema(ctx, "dedup")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = e.dropSchema(context.Background(), schema) }()
			target, err := v.setup(ctx, e, schema)
			if err != nil {
				t.Fatal(err)
			}
			if target.stop != nil {
				defer target.stop()
			}
			const n = 250
			if err := e.publishConcurrently(ctx, n, 100, payloadSize, func(ctx context.Context, tx pgx.Tx, g *gen, k int) error {
				return target.publish(ctx, tx, g.messages(k))
			}); err != nil {
				t.Fatal(err)
			}
			got, err := e.count(ctx, target.countSQL)
			if err != nil {
				t.Fatal(err)
			}
			if want := map[string]int{"nokeys": n, "keys-new": n, "keys-taken": 0}[v.name]; got != want {
				t.Fatalf("%d messages written, want %d", got, want)
			}
		})
	}
}
