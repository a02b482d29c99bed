package admin_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
)

// Status counts each topic's dedup keys whose window is not over, up to
// DedupKeysCountLimit; expired ones (not yet deleted by retention) are
// not counted, and a topic filter counts only its topic.
func TestStatusCountsDedupKeysPerTopic(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.Register("orders", 2)
	e.Register("clicks", 1)
	e.Register("plain", 1)
	msgs := make([]*message.Message, 3)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprint("m", i), nil)
		if err := outbox.DedupKey(msgs[i], fmt.Sprint("key-", i)); err != nil {
			t.Fatal(err)
		}
	}
	e.Publish("orders", msgs...)
	e.Exec("INSERT INTO " + e.Schema + ".dedup_keys (topic, dedup_key, expires_at) VALUES ('clicks', 'expired', now() - interval '1 second')")
	e.Exec("INSERT INTO "+e.Schema+".dedup_keys (topic, dedup_key, expires_at) SELECT 'clicks', 'k' || g, now() + interval '1 hour' FROM generate_series(1, $1::int) g",
		admin.DedupKeysCountLimit+5)

	rep, err := e.admin.Status(ctx, admin.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, tp := range rep.Topics {
		got[tp.Topic] = tp.DedupKeys
	}
	want := map[string]int64{"orders": 3, "clicks": admin.DedupKeysCountLimit, "plain": 0}
	for topic, n := range want {
		if got[topic] != n {
			t.Errorf("%s: DedupKeys %d, want %d", topic, got[topic], n)
		}
	}
	rep, err = e.admin.Status(ctx, admin.Filter{Topic: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Topics) != 1 || rep.Topics[0].DedupKeys != 3 {
		t.Fatalf("Status(orders): %+v", rep.Topics)
	}
}
