package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/relay"
)

// dedupRace is a run of parallel publishers racing on a few dedup keys.
type dedupRace struct {
	publishers, txs, keys, perCall int
}

// raceOutcome is what the publishers saw, over their committed
// transactions only.
type raceOutcome struct {
	stored    map[string]string // uuid -> dedup key ("" for none), of messages Publish stored
	committed map[string]bool   // dedup keys published in a committed transaction
	// Keys a transaction that rolled back had claimed (Publish stored its
	// message): a committed message of such a key was stored after that
	// rollback freed it.
	claimedInRollback map[string]bool
	rolledBack        int
}

// run starts r.publishers goroutines, each running r.txs transactions of
// one Publish of r.perCall messages with random keys out of r.keys fresh
// ones every second transaction (so that the publishers, going at about
// the same pace, race on new keys all along; a key may repeat within a
// call; one message in five has none). A third of the transactions roll
// back. Each transaction holds its claims a moment before it ends, so that
// the others pile up behind them.
func (r dedupRace) run(t *testing.T, b *outboxtest.Bundle, mode outbox.PublishMode) raceOutcome {
	t.Helper()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: b.Schema, Mode: mode}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := outboxtest.Ctx(t)
	out := raceOutcome{stored: map[string]string{}, committed: map[string]bool{}, claimedInRollback: map[string]bool{}}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errc = make(chan error, r.publishers)
	)
	for w := range r.publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := range r.txs {
				msgs := make([]*message.Message, r.perCall)
				for j := range msgs {
					msgs[j] = message.NewMessage(fmt.Sprintf("w%d-t%d-m%d", w, i, j), []byte("x"))
					if rng.IntN(5) > 0 {
						if err := outbox.DedupKey(msgs[j], fmt.Sprintf("round-%03d-key-%d", i/2, rng.IntN(r.keys))); err != nil {
							errc <- err
							return
						}
					}
				}
				rollback := rng.IntN(3) == 0
				hold := time.Duration(rng.IntN(2000)) * time.Microsecond
				err := pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
					txCtx := outbox.WithTx(ctx, tx)
					for _, m := range msgs {
						m.SetContext(txCtx)
					}
					if err := pub.Publish("orders", msgs...); err != nil {
						return err
					}
					time.Sleep(hold)
					if rollback {
						return errRollback
					}
					return nil
				})
				switch {
				case rollback && errors.Is(err, errRollback):
					mu.Lock()
					out.rolledBack++
					for _, m := range msgs {
						if key := m.Metadata.Get(outbox.DedupKeyMetadata); key != "" && !outbox.Deduplicated(m) {
							out.claimedInRollback[key] = true
						}
					}
					mu.Unlock()
					continue
				case err != nil:
					errc <- fmt.Errorf("publisher %d, transaction %d: %w", w, i, err)
					return
				}
				mu.Lock()
				for _, m := range msgs {
					key := m.Metadata.Get(outbox.DedupKeyMetadata)
					if key != "" {
						out.committed[key] = true
					}
					if !outbox.Deduplicated(m) {
						out.stored[m.UUID] = key
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if out.rolledBack == 0 || len(out.committed) == 0 {
		t.Fatalf("the race had %d rollbacks and %d keys committed: no race", out.rolledBack, len(out.committed))
	}
	return out
}

var errRollback = errors.New("roll back")

// check compares what the publishers saw with the messages found (uuid ->
// dedup key) and the claims left in dedup_keys: exactly the messages
// Publish said it stored in committed transactions are there, one per key
// for every key a committed transaction published (a key only rolled-back
// transactions claimed was free again for the next), and one claim each.
func (o raceOutcome) check(t *testing.T, b *outboxtest.Bundle, found map[string]string) {
	t.Helper()
	var missing, extra []string
	for uuid := range o.stored {
		if _, ok := found[uuid]; !ok {
			missing = append(missing, uuid)
		}
	}
	perKey := map[string][]string{}
	for uuid, key := range found {
		if _, ok := o.stored[uuid]; !ok {
			extra = append(extra, uuid)
		}
		if key != "" {
			perKey[key] = append(perKey[key], uuid)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("stored but not found: %v; found but reported deduplicated, or of a rolled-back transaction: %v", missing, extra)
	}
	for key := range o.committed {
		if n := len(perKey[key]); n != 1 {
			t.Errorf("key %s: %d messages %v, want exactly 1", key, n, perKey[key])
		}
	}
	for key, uuids := range perKey {
		if !o.committed[key] {
			t.Errorf("key %s only in rolled-back transactions has messages %v", key, uuids)
		}
	}
	if n := b.Int("SELECT count(*) FROM " + b.Schema + ".dedup_keys"); n != int64(len(o.committed)) {
		t.Errorf("%d claims left, want one per key committed (%d)", n, len(o.committed))
	}
	freed := 0
	for key := range o.claimedInRollback {
		if o.committed[key] {
			freed++
		}
	}
	if freed == 0 {
		t.Error("no key claimed by a transaction that rolled back was stored by another: the race did not exercise it")
	}
	t.Logf("%d keys committed (%d of them after a claim that rolled back), %d messages stored, %d transactions rolled back",
		len(o.committed), freed, len(o.stored), o.rolledBack)
}

// foundIn reads uuid -> dedup key of the messages of topic orders in
// table (pending or log).
func foundIn(t *testing.T, b *outboxtest.Bundle, table string) map[string]string {
	t.Helper()
	rows, err := b.Pool.Query(outboxtest.Ctx(t), "SELECT uuid, coalesce(metadata->>$1, '') FROM "+b.Schema+"."+table+" WHERE topic = 'orders'", outbox.DedupKeyMetadata)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	var uuid, key string
	if _, err := pgx.ForEachRow(rows, []any{&uuid, &key}, func() error {
		if _, dup := found[uuid]; dup {
			return fmt.Errorf("message %s stored twice", uuid)
		}
		found[uuid] = key
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return found
}

// Parallel publishers racing on a few keys in the table mode, a third of
// their transactions rolled back: every key a committed transaction
// published is stored exactly once, by a committed transaction, and
// Deduplicated tells each publisher exactly which of its messages were not
// stored. Claims are taken in key order: no deadlock however the calls'
// keys overlap.
func TestDedupParallelPublishersRacingOnKeys(t *testing.T) {
	t.Parallel()
	b := outboxtest.Setup(t)
	b.Register("orders", 4)
	out := dedupRace{publishers: 8, txs: 60, keys: 4, perCall: 6}.run(t, b, outbox.ModeTable)
	out.check(t, b, foundIn(t, b, "pending"))
}

// The same race in the log-based mode: the claims are rows written in the
// caller's transaction, and only the messages whose key was claimed go
// into the WAL; a relay appends exactly those to the log.
func TestDedupParallelPublishersRacingOnKeysWAL(t *testing.T) {
	t.Parallel()
	b, _ := outboxtest.OwnCluster(t, map[string]string{"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4"}, "waldedup")
	b.Register("orders", 4)
	if err := relay.CreateSlot(outboxtest.Ctx(t), b.Pool, b.Schema); err != nil {
		t.Fatal(err)
	}
	out := dedupRace{publishers: 6, txs: 30, keys: 4, perCall: 5}.run(t, b, outbox.ModeWAL)
	if n := b.Int("SELECT count(*) FROM " + b.Schema + ".pending"); n != 0 {
		t.Fatalf("%d messages in pending in ModeWAL", n)
	}
	r, err := relay.New(relay.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	outboxtest.WaitFor(t, "the relay to append every stored message", time.Minute, func() bool {
		return b.Int("SELECT count(*) FROM "+b.Schema+".log") >= int64(len(out.stored))
	})
	time.Sleep(200 * time.Millisecond) // anything more would be appended by now
	_ = r.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	out.check(t, b, foundIn(t, b, "log"))
}

// In the log-based mode, a call whose messages are all deduplicated writes
// nothing into the WAL, so it needs no slot (the test server runs with
// wal_level = replica); a call with a message to write still fails
// without one, and its claims go with the aborted transaction.
func TestDedupWALCallWithNothingLeftWritesNothing(t *testing.T) {
	t.Parallel()
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	b.Exec("INSERT INTO " + b.Schema + ".dedup_keys (topic, dedup_key, expires_at) VALUES ('orders', 'taken', now() + interval '1 hour')")
	pub := b.Publisher(func(c *outbox.PublisherConfig) { c.Mode = outbox.ModeWAL })
	m := deduped(t, "dup", "taken")
	if err := pub.Publish("orders", m, deduped(t, "dup-again", "taken")); err != nil || !outbox.Deduplicated(m) {
		t.Fatalf("all deduplicated in ModeWAL without a slot: %v, deduplicated %v", err, outbox.Deduplicated(m))
	}
	err := pub.Publish("orders", deduped(t, "dup-3", "taken"), deduped(t, "new", "free"))
	if !errors.Is(err, outbox.ErrWALLevel) {
		t.Fatalf("a new key in ModeWAL without wal_level logical: %v, want ErrWALLevel", err)
	}
	if got := b.Int("SELECT count(*) FROM " + b.Schema + ".dedup_keys"); got != 1 || !strings.Contains(err.Error(), "none of the 2 message(s)") {
		t.Fatalf("%d claims after the refused call (want 1), error %v", got, err)
	}
}
