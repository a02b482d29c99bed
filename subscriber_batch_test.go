package outbox_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// countCursorWrites installs a trigger that counts updates of cursor seqs.
func countCursorWrites(t *testing.T, e env) func() int {
	t.Helper()
	stmts := []string{
		"CREATE TABLE " + e.Schema + ".cursor_writes (n bigint NOT NULL)",
		"INSERT INTO " + e.Schema + ".cursor_writes VALUES (0)",
		`CREATE FUNCTION ` + e.Schema + `.count_cursor_write() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN UPDATE ` + e.Schema + `.cursor_writes SET n = n + 1; RETURN NEW; END $$`,
		`CREATE TRIGGER count_cursor_write AFTER UPDATE ON ` + e.Schema + `.cursors FOR EACH ROW
		WHEN (OLD.seq IS DISTINCT FROM NEW.seq) EXECUTE FUNCTION ` + e.Schema + `.count_cursor_write()`,
	}
	for _, s := range stmts {
		if _, err := e.Pool.Exec(outboxtest.Ctx(t), s); err != nil {
			t.Fatal(err)
		}
	}
	return func() int {
		var n int
		if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT n FROM "+e.Schema+".cursor_writes").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

func TestCursorIsWrittenOncePerBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("b", 1)
	writes := countCursorWrites(t, e)
	uuids := publishKeyed(t, e, "b", 1, 640)
	e.SequenceAll()               // the whole backlog is there before the first read
	sub := newSub(t, e, "g", nil) // batches of 32
	defer sub.Close()
	h := &handled{}
	wg := consume(context.Background(), t, sub, "b", "one", h, 0)
	outboxtest.WaitFor(t, "all messages", time.Minute, func() bool { return h.distinct() == len(uuids) })
	outboxtest.WaitFor(t, "the cursor write of the last batch", 30*time.Second, func() bool { return writes() >= 640/32 })
	if n := writes(); n != 640/32 {
		t.Fatalf("%d cursor writes for 640 messages in batches of 32, want %d", n, 640/32)
	}
	_ = sub.Close()
	wg.Wait()
}

func TestConsumeBatchesRetriesTheRestAndRejectsPoison(t *testing.T) {
	t.Parallel()
	for _, strategy := range []outbox.Strategy{outbox.Leased, outbox.Transactional} {
		t.Run(strategy.String(), func(t *testing.T) {
			e := newEnv(t)
			e.Register("batches", 4)
			rejects, rejected := rejectLog(t, e)
			uuids := publishKeyed(t, e, "batches", 20, 50) // 1,000 messages
			const poison = "k7-n20"
			sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) {
				c.Strategy = strategy
				c.RejectHandler = rejects
			})
			ctxRun, cancel := context.WithCancel(context.Background())
			defer cancel()

			var mu sync.Mutex
			lastN := map[string]int{}
			doneIDs := map[string]bool{}
			calls, sizes := 0, map[int]int{}
			failedOnce := map[string]bool{}
			var orderErr error
			handler := func(c context.Context, batch []*message.Message) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				calls++
				sizes[len(batch)]++
				for i, m := range batch {
					if m.UUID == poison {
						if strategy == outbox.Leased {
							for _, d := range batch[:i] {
								markDone(d, lastN, doneIDs, &orderErr)
							}
						}
						return i, outbox.Reject(m, errors.New("cannot parse"))
					}
					// The first time a message is the 5th of a batch, fail there:
					// the first four count, the rest is retried.
					if i == 4 && !failedOnce[m.UUID] {
						failedOnce[m.UUID] = true
						if strategy == outbox.Transactional {
							return 4, errors.New("transient") // the whole batch is undone
						}
						for _, d := range batch[:4] {
							markDone(d, lastN, doneIDs, &orderErr)
						}
						return 4, errors.New("transient")
					}
				}
				for _, m := range batch {
					markDone(m, lastN, doneIDs, &orderErr)
				}
				return len(batch), nil
			}
			result := make(chan error, 1)
			go func() { result <- sub.ConsumeBatches(ctxRun, "batches", handler) }()
			outboxtest.WaitFor(t, "every message", time.Minute, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(doneIDs) == len(uuids)-1
			})
			cancel()
			if err := <-result; err != nil {
				t.Fatal(err)
			}
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if orderErr != nil {
				t.Fatal(orderErr)
			}
			rs := rejected()
			if len(rs) != 1 || rs[0].UUID != poison || rs[0].Reason.Error() != "cannot parse" {
				t.Fatalf("rejected = %+v", rs)
			}
			if calls >= len(uuids)/2 {
				t.Fatalf("%d handler calls for %d messages: not batched", calls, len(uuids))
			}
			t.Logf("%d batch calls, sizes %v", calls, sizes)
		})
	}
}

// markDone records a message as processed, checking per-key order; a
// message done twice (after a retry of a transactional batch) is fine as
// long as its key's order holds.
func markDone(m *message.Message, lastN map[string]int, done map[string]bool, orderErr *error) {
	id := m.Metadata.Get(outbox.MetadataID)
	if done[id] {
		return
	}
	key := m.Metadata.Get(outbox.MetadataPartitionKey)
	n, _ := strconv.Atoi(m.Metadata.Get("n"))
	if n != lastN[key]+1 && *orderErr == nil && !(key == "key-7" && n == 21 && lastN[key] == 19) {
		*orderErr = errors.New("key " + key + ": n=" + strconv.Itoa(n) + " after n=" + strconv.Itoa(lastN[key]))
	}
	lastN[key] = n
	done[id] = true
}

func TestWorkersSurvivePanics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("p", 2)
	uuids := publishKeyed(t, e, "p", 4, 25)
	var panickedReject bool
	var mu sync.Mutex
	rejects := outboxtype.RejectHandlerFunc(func(c context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
		mu.Lock()
		defer mu.Unlock()
		if !panickedReject {
			panickedReject = true
			panic("reject handler blew up")
		}
		return nil
	})
	sub := newSub(t, e, "g", func(c *outbox.SubscriberConfig) { c.RejectHandler = rejects })
	ctxRun, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	done := map[string]bool{}
	rejectedOnce := false
	handler := func(c context.Context, batch []*message.Message) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			panic("batch handler blew up")
		}
		for i, m := range batch {
			if m.UUID == uuids[10] && !rejectedOnce {
				rejectedOnce = true
				return i, outbox.Reject(m, errors.New("poison"))
			}
			done[m.Metadata.Get(outbox.MetadataID)] = true
		}
		return len(batch), nil
	}
	result := make(chan error, 1)
	go func() { result <- sub.ConsumeBatches(ctxRun, "p", handler) }()
	outboxtest.WaitFor(t, "every message after the panics", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) >= len(uuids)-1
	})
	mu.Lock()
	if !panickedReject || calls < 2 {
		t.Fatalf("panics not exercised: reject %v, calls %d", panickedReject, calls)
	}
	mu.Unlock()
	cancel()
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
}
