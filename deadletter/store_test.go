package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/partitioning"
)

func TestConfigValidate(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		cfg  deadletter.Config
		want error
	}{
		{"no pool", deadletter.Config{}, outbox.ErrInvalidConfig},
		{"bad schema", deadletter.Config{Pool: e.Pool, Schema: "Bad-Schema"}, outbox.ErrInvalidName},
		{"tiny reason", deadletter.Config{Pool: e.Pool, MaxReasonBytes: 3}, outbox.ErrInvalidConfig},
		{"ok", deadletter.Config{Pool: e.Pool}, nil},
	} {
		err := tc.cfg.Validate()
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if _, nerr := deadletter.NewStore(tc.cfg, nil); (nerr == nil) != (err == nil) {
			t.Errorf("%s: NewStore %v, Validate %v", tc.name, nerr, err)
		}
	}
}

// A dead-lettered message is replayed as a new message with its key and
// metadata, consumed again, and the entry is replayed; the status change
// and the publish are one transaction.
func TestReplayRoundTrip(t *testing.T) {
	e := newEnv(t)
	e.Register("orders", 4)
	var msgs []*message.Message
	for n := 1; n <= 20; n++ {
		payload := "ok"
		if n == 7 {
			payload = "bad"
		}
		m := outboxtest.Keyed("o"+strconv.Itoa(n), "k-"+strconv.Itoa(n%5), n, payload)
		m.Metadata.Set("tenant", "acme")
		msgs = append(msgs, m)
	}
	e.Publish("orders", msgs...)

	sub := e.subscriber(t, "g", nil)
	ch, err := sub.Subscribe(context.Background(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *message.Message, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			// Rejected the first time; the replayed copy is fine ("fixed").
			if string(m.Payload) == "bad" && m.Metadata.Get(deadletter.MetadataReplayOf) == "" {
				_ = outbox.Reject(m, errors.New("bad order"))
				m.Nack()
				continue
			}
			got <- m
			m.Ack()
		}
	}()
	outboxtest.WaitFor(t, "the dead letter", 30*time.Second, func() bool { return e.count(t, deadletter.Filter{}) == 1 })
	page, err := e.store.List(outboxtest.Ctx(t), deadletter.ListOptions{Filter: deadletter.Filter{Statuses: []deadletter.Status{deadletter.StatusPending}}})
	if err != nil || len(page.Entries) != 1 {
		t.Fatalf("%+v, %v", page, err)
	}
	entry := page.Entries[0]
	if entry.UUID != "o7" || entry.Reason != "bad order" || entry.Attempts != 1 {
		t.Fatalf("entry %+v", entry)
	}

	replayed, err := e.store.Replay(outboxtest.Ctx(t), entry.ID, deadletter.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if replayed.Status != deadletter.StatusReplayed || replayed.ReplayTopic != "orders" || replayed.ReplayUUID == "" || replayed.ReplayUUID == entry.UUID {
		t.Fatalf("after replay: %+v", replayed)
	}
	var again *message.Message
	outboxtest.WaitFor(t, "the replayed message", 30*time.Second, func() bool {
		for {
			select {
			case m := <-got:
				if m.UUID == replayed.ReplayUUID {
					again = m
					return true
				}
			default:
				return false
			}
		}
	})
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	<-done
	if p := again.Metadata.Get(outbox.MetadataPartition); p != strconv.Itoa(entry.Partition) {
		t.Fatalf("replayed into partition %s, the original was in %d", p, entry.Partition)
	}
	if again.Metadata.Get(outbox.PublishPartitionKeyMetadata) != "k-2" || again.Metadata.Get("tenant") != "acme" || again.Metadata.Get("n") != "7" ||
		again.Metadata.Get(deadletter.MetadataReplayOf) != strconv.FormatInt(entry.ID, 10) ||
		again.Metadata.Get(deadletter.MetadataOriginalUUID) != "o7" || string(again.Payload) != "bad" {
		t.Fatalf("replayed message metadata %v payload %q", again.Metadata, again.Payload)
	}
	if seq, _ := strconv.ParseInt(again.Metadata.Get(outbox.MetadataSeq), 10, 64); seq <= entry.Seq {
		t.Fatalf("replayed at seq %d, not after the original %d", seq, entry.Seq)
	}
	if n := e.count(t, deadletter.Filter{Statuses: []deadletter.Status{deadletter.StatusReplayed}}); n != 1 {
		t.Fatalf("%d replayed entries", n)
	}

	// A replayed entry cannot be replayed or discarded again.
	if _, err := e.store.Replay(outboxtest.Ctx(t), entry.ID, deadletter.ReplayOptions{}); !errors.Is(err, deadletter.ErrInvalidState) {
		t.Fatalf("second replay: %v", err)
	}
	var se *deadletter.StateError
	if _, err := e.store.Discard(outboxtest.Ctx(t), entry.ID); !errors.As(err, &se) || se.Status != deadletter.StatusReplayed || se.Op != "discard" {
		t.Fatalf("discard of a replayed entry: %v", err)
	}
}

func addEntry(t *testing.T, e env, m outboxtype.RejectedMessage) deadletter.Entry {
	t.Helper()
	if added, err := e.store.Add(outboxtest.Ctx(t), m); err != nil || !added {
		t.Fatalf("add: %v, %v", added, err)
	}
	page, err := e.store.List(outboxtest.Ctx(t), deadletter.ListOptions{Limit: 1, Descending: true})
	if err != nil || len(page.Entries) != 1 {
		t.Fatalf("%+v, %v", page, err)
	}
	return page.Entries[0]
}

// Replay to a named topic, which must be registered: a failed replay
// publishes nothing and leaves the entry pending.
func TestReplayToNamedTopic(t *testing.T) {
	e := newEnv(t)
	entry := addEntry(t, e, outboxtype.RejectedMessage{
		Group: "g", Topic: "orders", Partition: 1, Seq: 5, UUID: "u5", PartitionKey: "customer-1",
		Metadata: map[string]string{"x": "y", outbox.MetadataSeq: "5"}, Payload: []byte("body"), Reason: errors.New("r"),
	})
	_, err := e.store.Replay(outboxtest.Ctx(t), entry.ID, deadletter.ReplayOptions{Topic: "orders-retry"})
	if !errors.Is(err, outbox.ErrUnknownTopic) {
		t.Fatalf("replay to an unregistered topic: %v", err)
	}
	if got, err := e.store.Get(outboxtest.Ctx(t), entry.ID); err != nil || got.Status != deadletter.StatusPending {
		t.Fatalf("after a failed replay: %+v, %v", got, err)
	}
	if n := e.Int("SELECT count(*) FROM " + e.Schema + ".pending"); n != 0 {
		t.Fatalf("%d messages published by a failed replay", n)
	}

	e.Register("orders-retry", 8)
	replayed, err := e.store.Replay(outboxtest.Ctx(t), entry.ID, deadletter.ReplayOptions{Topic: "orders-retry"})
	if err != nil {
		t.Fatal(err)
	}
	var (
		topic, key, uuid string
		partition        int
		md               map[string]string
		payload          []byte
	)
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT topic, partition, partition_key, uuid, metadata, payload FROM "+e.Schema+".pending").
		Scan(&topic, &partition, &key, &uuid, &md, &payload); err != nil {
		t.Fatal(err)
	}
	wantPartition, err := partitioning.Default().Partition("customer-1", 8)
	if err != nil {
		t.Fatal(err)
	}
	if topic != "orders-retry" || partition != wantPartition || key != "customer-1" || uuid != replayed.ReplayUUID || md["x"] != "y" || string(payload) != "body" {
		t.Fatalf("published %s %d %s %s %v %q", topic, partition, key, uuid, md, payload)
	}
	if _, stale := md[outbox.MetadataSeq]; stale {
		t.Fatalf("delivery metadata carried over: %v", md)
	}
	if replayed.ReplayTopic != "orders-retry" || replayed.Status != deadletter.StatusReplayed || !replayed.UpdatedAt.After(replayed.CreatedAt) {
		t.Fatalf("entry %+v", replayed)
	}
}

func TestOperationsOnMissingEntries(t *testing.T) {
	e := newEnv(t)
	if _, err := e.store.Get(outboxtest.Ctx(t), 42); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Get: %v", err)
	}
	if _, err := e.store.Replay(outboxtest.Ctx(t), 42, deadletter.ReplayOptions{}); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Replay: %v", err)
	}
	if _, err := e.store.Discard(outboxtest.Ctx(t), 42); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Discard: %v", err)
	}
}

func TestDiscard(t *testing.T) {
	e := newEnv(t)
	entry := addEntry(t, e, outboxtype.RejectedMessage{Group: "g", Topic: "t", Partition: 0, Seq: 1, UUID: "u"})
	d, err := e.store.Discard(outboxtest.Ctx(t), entry.ID)
	if err != nil || d.Status != deadletter.StatusDiscarded {
		t.Fatalf("%+v, %v", d, err)
	}
	if _, err := e.store.Discard(outboxtest.Ctx(t), entry.ID); !errors.Is(err, deadletter.ErrInvalidState) {
		t.Fatalf("second discard: %v", err)
	}
	if _, err := e.store.Replay(outboxtest.Ctx(t), entry.ID, deadletter.ReplayOptions{}); !errors.Is(err, deadletter.ErrInvalidState) {
		t.Fatalf("replay of a discarded entry: %v", err)
	}
}

// Keyset paging visits every entry exactly once, in order, in both
// directions, also while entries are added between pages; filters and
// Count agree.
func TestListPagingAndFilters(t *testing.T) {
	e := newEnv(t)
	const total = 250
	err := pgx.BeginFunc(outboxtest.Ctx(t), e.Pool, func(tx pgx.Tx) error {
		for i := 0; i < total; i++ {
			m := outboxtype.RejectedMessage{
				Group: []string{"a", "b"}[i%2], Topic: []string{"t1", "t2", "t3"}[i%3],
				Partition: i % 4, Seq: int64(i + 1), UUID: "u" + strconv.Itoa(i), Reason: errors.New("r"),
			}
			if err := e.store.HandleReject(outboxtest.Ctx(t), tx, m); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A tenth discarded, and a fifth written two days ago.
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "UPDATE "+e.Schema+".dead_letters SET status = 'discarded' WHERE seq % 10 = 0"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "UPDATE "+e.Schema+".dead_letters SET created_at = now() - interval '2 days' WHERE seq % 5 = 1"); err != nil {
		t.Fatal(err)
	}

	for _, desc := range []bool{false, true} {
		t.Run(fmt.Sprintf("descending=%v", desc), func(t *testing.T) {
			var ids []int64
			cursor, pages := "", 0
			for {
				page, err := e.store.List(outboxtest.Ctx(t), deadletter.ListOptions{Limit: 100, Cursor: cursor, Descending: desc})
				if err != nil {
					t.Fatal(err)
				}
				pages++
				for _, en := range page.Entries {
					ids = append(ids, en.ID)
				}
				if pages == 1 && !desc {
					// Written while paging: they come after everything listed so far.
					for i := 0; i < 3; i++ {
						addEntry(t, e, outboxtype.RejectedMessage{Group: "late", Topic: "t1", UUID: "late-" + strconv.Itoa(i)})
					}
				}
				if page.NextCursor == "" {
					break
				}
				cursor = page.NextCursor
			}
			want := total + 3 // the late ones are written during the first subtest
			if len(ids) != want || pages != 3 {
				t.Fatalf("%d entries on %d pages, want %d on 3", len(ids), pages, want)
			}
			for i := 1; i < len(ids); i++ {
				if desc && ids[i] >= ids[i-1] || !desc && ids[i] <= ids[i-1] {
					t.Fatalf("ids out of order or repeated at %d: %d after %d", i, ids[i], ids[i-1])
				}
			}
		})
	}

	pending := []deadletter.Status{deadletter.StatusPending}
	for _, tc := range []struct {
		f    deadletter.Filter
		want int64
	}{
		{deadletter.Filter{}, total + 3},
		{deadletter.Filter{Group: "a"}, total / 2},
		{deadletter.Filter{Group: "a", Topic: "t1"}, 42},                                   // i%6 == 0
		{deadletter.Filter{Statuses: []deadletter.Status{deadletter.StatusDiscarded}}, 25}, // seq%10 == 0
		{deadletter.Filter{Statuses: pending, Group: "b"}, 125 - 25},                       // even seq: group b
		{deadletter.Filter{To: time.Now().Add(-24 * time.Hour)}, 50},                       // seq%5 == 1
		{deadletter.Filter{From: time.Now().Add(-24 * time.Hour), To: time.Now().Add(time.Hour)}, total - 50 + 3},
		{deadletter.Filter{Statuses: []deadletter.Status{deadletter.StatusReplayed}}, 0},
	} {
		n := e.count(t, tc.f)
		if n != tc.want {
			t.Errorf("Count(%+v) = %d, want %d", tc.f, n, tc.want)
		}
		// Paging through the same filter finds as many.
		var listed int64
		opts := deadletter.ListOptions{Filter: tc.f, Limit: 7}
		for {
			page, err := e.store.List(outboxtest.Ctx(t), opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, en := range page.Entries {
				if tc.f.Group != "" && en.Group != tc.f.Group || tc.f.Topic != "" && en.Topic != tc.f.Topic {
					t.Fatalf("filter %+v listed %+v", tc.f, en)
				}
			}
			listed += int64(len(page.Entries))
			if page.NextCursor == "" {
				break
			}
			opts.Cursor = page.NextCursor
		}
		if listed != tc.want {
			t.Errorf("List(%+v) found %d, want %d", tc.f, listed, tc.want)
		}
	}

	// Bad arguments.
	first, err := e.store.List(outboxtest.Ctx(t), deadletter.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range []deadletter.ListOptions{
		{Cursor: "not a cursor"},
		{Cursor: first.NextCursor, Descending: true}, // from an ascending listing
		{Limit: deadletter.MaxPageSize + 1},
		{Limit: -1},
		{Filter: deadletter.Filter{Statuses: []deadletter.Status{"lost"}}},
	} {
		if _, err := e.store.List(outboxtest.Ctx(t), opts); !errors.Is(err, outbox.ErrInvalidArgument) {
			t.Errorf("List(%+v): %v, want ErrInvalidArgument", opts, err)
		}
	}
}

func TestPurge(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 40; i++ {
		addEntry(t, e, outboxtype.RejectedMessage{Group: "g", Topic: "t", Partition: 0, Seq: int64(i + 1), UUID: "u" + strconv.Itoa(i)})
	}
	// Half of them ten days old; of each half, a quarter discarded and a
	// quarter replayed (set directly), the other half pending.
	for _, stmt := range []string{
		"UPDATE {s}.dead_letters SET created_at = now() - interval '10 days' WHERE seq <= 20",
		"UPDATE {s}.dead_letters SET status = 'discarded' WHERE seq % 4 = 1",
		"UPDATE {s}.dead_letters SET status = 'replayed' WHERE seq % 4 = 2",
	} {
		if _, err := e.Pool.Exec(outboxtest.Ctx(t), strings.ReplaceAll(stmt, "{s}", e.Schema)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := outboxtest.Ctx(t)
	week := 7 * 24 * time.Hour
	pending := []deadletter.Status{deadletter.StatusPending}
	plan, err := e.store.PlanPurge(ctx, deadletter.PurgeOptions{OlderThan: week})
	if err != nil {
		t.Fatal(err)
	}
	if c := plan.Counts; c[deadletter.StatusPending] != 10 || c[deadletter.StatusReplayed] != 5 || c[deadletter.StatusDiscarded] != 5 || plan.Deleted() != 10 {
		t.Fatalf("plan of old entries: %+v, deletes %d; want 10 pending kept, 5 replayed and 5 discarded deleted", plan, plan.Deleted())
	}
	n, err := e.store.Purge(ctx, deadletter.PurgeOptions{Before: plan.Before, ChunkSize: 3})
	if err != nil || n != 10 {
		t.Fatalf("purge of old entries: %d, %v; want the 10 old resolved ones", n, err)
	}
	if c := e.count(t, deadletter.Filter{Statuses: pending}); c != 20 {
		t.Fatalf("%d pending entries left, want all 20: pending ones are kept unless named", c)
	}
	n, err = e.store.Purge(ctx, deadletter.PurgeOptions{})
	if err != nil || n != 10 {
		t.Fatalf("purge without options: %d, %v; want the 10 recent resolved ones, no pending one", n, err)
	}
	if c := e.count(t, deadletter.Filter{}); c != 20 {
		t.Fatalf("%d left, want the 20 pending ones", c)
	}
	plan, err = e.store.PlanPurge(ctx, deadletter.PurgeOptions{OlderThan: week, Statuses: pending})
	if err != nil || plan.Deleted() != 10 || plan.Counts[deadletter.StatusPending] != 10 {
		t.Fatalf("plan of old pending entries: %+v, %v; want 10", plan, err)
	}
	n, err = e.store.Purge(ctx, deadletter.PurgeOptions{Before: plan.Before, Statuses: pending})
	if err != nil || n != 10 {
		t.Fatalf("purge of old pending entries, named: %d, %v; want 10", n, err)
	}
	n, err = e.store.Purge(ctx, deadletter.PurgeOptions{Statuses: pending})
	if err != nil || n != 10 {
		t.Fatalf("purge of pending entries of any age, named: %d, %v; want 10", n, err)
	}
	for _, opts := range []deadletter.PurgeOptions{
		{OlderThan: -time.Second},
		{OlderThan: week, Before: time.Now()},
		{Statuses: []deadletter.Status{"lost"}},
		{ChunkSize: -1},
	} {
		if _, err := e.store.Purge(ctx, opts); !errors.Is(err, outbox.ErrInvalidArgument) {
			t.Errorf("Purge(%+v): %v, want ErrInvalidArgument", opts, err)
		}
		if _, err := e.store.PlanPurge(ctx, opts); !errors.Is(err, outbox.ErrInvalidArgument) {
			t.Errorf("PlanPurge(%+v): %v, want ErrInvalidArgument", opts, err)
		}
	}
}

// Every entry point of the store refuses a schema Migrate never ran on.
func TestStoreRefusesAnUnmigratedSchema(t *testing.T) {
	pool := pgtest.Pool(t)
	store, err := deadletter.NewStore(deadletter.Config{Schema: pgtest.Schema(t), Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := outboxtest.Ctx(t)
	_, list := store.List(ctx, deadletter.ListOptions{})
	_, count := store.Count(ctx, deadletter.Filter{})
	_, get := store.Get(ctx, 1)
	_, replay := store.Replay(ctx, 1, deadletter.ReplayOptions{})
	_, discard := store.Discard(ctx, 1)
	_, purge := store.Purge(ctx, deadletter.PurgeOptions{})
	_, plan := store.PlanPurge(ctx, deadletter.PurgeOptions{})
	_, add := store.Add(ctx, outboxtype.RejectedMessage{Group: "g", Topic: "t", UUID: "u", Reason: errors.New("x")})
	for name, err := range map[string]error{"List": list, "Count": count, "Get": get, "Replay": replay, "Discard": discard, "Purge": purge, "PlanPurge": plan, "Add": add} {
		if !errors.Is(err, outbox.ErrNotMigrated) {
			t.Errorf("%s: %v, want ErrNotMigrated", name, err)
		}
	}
}
