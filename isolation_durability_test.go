// Key isolation across failures of the process and of PostgreSQL: the held
// state survives a killed consumer and a server restart.

package outbox_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// A consumer killed (SIGKILL) while a key is held: the next lease holder
// goes on from the held rows. Nothing is lost, A keeps its order, and B and
// C are delivered again at most for the batch in flight at the kill (the
// Leased strategy's at-least-once window).
func TestHeldKeySurvivesAKilledConsumer(t *testing.T) {
	t.Parallel()
	if os.Getenv("OUTBOX_ISO_CHILD") != "" {
		t.Skip("running as the child")
	}
	e := newEnv(t)
	e.Register("orders", 1)
	e.Exec("CREATE TABLE " + e.Schema + ".effects (id bigserial PRIMARY KEY, key text, n int, uuid text, pid int)")
	e.Exec("CREATE TABLE " + e.Schema + ".fixed (fixed boolean)")
	const n = 150
	publishInterleaved(e, "orders", n, "A", "B", "C")
	start := func() (*exec.Cmd, *strings.Builder) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestIsolatedConsumerChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "OUTBOX_ISO_CHILD=1", pgtest.EnvDatabaseURL+"="+pgtest.DatabaseURL(), "OUTBOX_ISO_SCHEMA="+e.Schema)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, &out
	}
	done := func(key string) int64 {
		return e.Int("SELECT count(DISTINCT n) FROM "+e.Schema+".effects WHERE key = $1", key)
	}
	first, _ := start()
	outboxtest.WaitFor(t, "A held and B half done", 60*time.Second, func() bool {
		return e.Rows("held") > 0 && done("B") >= n/3
	})
	if err := first.Process.Kill(); err != nil { // SIGKILL, mid-batch
		t.Fatal(err)
	}
	_ = first.Wait()
	killedAt := done("B") + done("C")
	heldAtKill := e.Rows("held")
	second, out := start()
	t.Cleanup(func() { _ = second.Process.Kill(); _ = second.Wait() })
	outboxtest.WaitFor(t, "B and C done by the next holder while A is held", 60*time.Second, func() bool {
		return done("B") == n && done("C") == n
	})
	if got := e.Int("SELECT count(*) FROM " + e.Schema + ".effects WHERE key = 'A'"); got != 0 {
		t.Fatalf("%d effects of A while A is poisoned", got)
	}
	e.Exec("INSERT INTO " + e.Schema + ".fixed VALUES (true)")
	outboxtest.WaitFor(t, "A done after the fix", 60*time.Second, func() bool { return done("A") == n })
	inOrderOnce(t, "A", e.effectsOf(t, "A"), n)
	for _, key := range []string{"B", "C"} {
		got := e.effectsOf(t, key)
		seen, dups, last := map[int]bool{}, 0, 0
		for _, v := range got {
			if seen[v] {
				dups++
				continue
			}
			if v != last+1 {
				t.Fatalf("%s: first deliveries out of order: %v", key, got)
			}
			seen[v], last = true, v
		}
		if dups > outboxtest.FastTuning().BatchSize {
			t.Fatalf("%s: %d messages delivered again, more than the batch in flight (%d)", key, dups, outboxtest.FastTuning().BatchSize)
		}
		t.Logf("%s: %d messages, %d delivered again after the kill", key, len(seen), dups)
	}
	if e.Rows("held") != 0 {
		t.Fatalf("%d held rows left:\n%s", e.Rows("held"), out.String())
	}
	t.Logf("killed with %d of B and C done and %d messages held", killedAt, heldAtKill)
}

// TestIsolatedConsumerChild is the consumer process of the test above: key
// A fails until the fixed table has a row; each effect takes 2 ms, so that
// the kill lands mid-batch.
func TestIsolatedConsumerChild(t *testing.T) {
	t.Parallel()
	if os.Getenv("OUTBOX_ISO_CHILD") == "" {
		t.Skip("only runs as the child of TestHeldKeySurvivesAKilledConsumer")
	}
	schema := os.Getenv("OUTBOX_ISO_SCHEMA")
	pool := pgtest.Pool(t)
	tu := outboxtest.FastTuning()
	tu.LeaseTTL = time.Second
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
		Schema: schema, Pool: pool, ConsumerGroup: "g", Tuning: tu, Advanced: outboxtest.FastAdvanced(),
		KeyIsolation: outbox.KeyIsolation{Enabled: true}, MaxAttempts: outbox.RetryForever, // A held until fixed
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(context.Background(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	for m := range msgs {
		key := m.Metadata.Get(outbox.MetadataPartitionKey)
		var fixed bool
		if key == "A" {
			_ = pool.QueryRow(context.Background(), "SELECT exists (SELECT FROM "+schema+".fixed)").Scan(&fixed)
			if !fixed {
				m.Nack()
				continue
			}
		}
		time.Sleep(2 * time.Millisecond)
		n, _ := strconv.Atoi(m.Metadata.Get("n"))
		if _, err := pool.Exec(context.Background(), "INSERT INTO "+schema+".effects (key, n, uuid, pid) VALUES ($1, $2, $3, $4)",
			key, n, m.UUID, os.Getpid()); err != nil {
			m.Nack()
			continue
		}
		m.Ack()
	}
}

// The held-back state survives a PostgreSQL crash and restart (immediate
// shutdown): the worker reconnects, finds A still held, B goes on, and A
// follows in order once it succeeds.
func TestHeldKeySurvivesAPostgreSQLRestart(t *testing.T) {
	t.Parallel()
	ctx := outboxtest.Ctx(t)
	b, cluster := outboxtest.OwnCluster(t, map[string]string{"synchronous_commit": "on"}, "iso_restart")
	e := env{b}
	e.Register("orders", 1)
	e.createEffects(t)
	publishInterleaved(e, "orders", 5, "A", "B")
	var fixed atomic.Bool
	isoConsumer(t, e, isoWays[0], "g", "orders", func(key, _ string) bool { return key == "A" && !fixed.Load() }, nil)
	outboxtest.WaitFor(t, "A held, B done", 20*time.Second, func() bool {
		return e.Rows("held") == 5 && len(e.effectsOf(t, "B")) == 5
	})
	// Relaxed commits (the Leased strategy's cursor moves) reach the disk
	// when the WAL writer flushes them (within three wal_writer_delays on
	// an idle machine); past that nothing may be lost. Wait for the flush
	// to pass everything written so far, however long it takes.
	written := e.Int("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
	outboxtest.WaitFor(t, "the WAL flushed up to what was written", time.Minute, func() bool {
		return e.Int("SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn") >= written
	})
	if err := cluster.Restart(ctx, pgcluster.RestartOptions{Mode: pgcluster.Immediate, Down: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if got := e.Rows("held"); got != 5 {
		t.Fatalf("%d held rows after the restart, want A's 5", got)
	}
	e.Publish("orders", outboxtest.Keyed("B6", "B", 6, "B"), outboxtest.Keyed("A6", "A", 6, "A"))
	outboxtest.WaitFor(t, "B6 after the restart, A6 held behind A", 30*time.Second, func() bool {
		return len(e.effectsOf(t, "B")) == 6 && e.Rows("held") == 6
	})
	fixed.Store(true)
	outboxtest.WaitFor(t, "A done", 30*time.Second, func() bool { return len(e.effectsOf(t, "A")) == 6 })
	inOrderOnce(t, "A", e.effectsOf(t, "A"), 6)
	inOrderOnce(t, "B", e.effectsOf(t, "B"), 6)
}
