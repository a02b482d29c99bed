package relay_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/relay"
)

// A PostgreSQL crash (immediate shutdown, twice) while publishers write
// and the relay streams: the relay reconnects, the slot (whose confirmed
// position is persisted at checkpoints, so it may be behind) sends
// transactions again, and the position written with the rows skips them.
// Every committed message is in the log once, 1..n per partition, in key
// order; a transaction whose COMMIT got no answer is there once or not at
// all.
func TestRelaySurvivesPostgreSQLCrashes(t *testing.T) {
	ctx := outboxtest.Ctx(t)
	b, cluster := outboxtest.OwnCluster(t, map[string]string{
		"synchronous_commit": "on", "wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4",
	}, "relay_crash")
	pool, schema := b.Pool, b.Schema
	b.Register("orders", 3)
	if err := relay.CreateSlot(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	r := startRelay(t, pool, schema, nil, nil)
	pub := walPublisher(t, b)

	p := startPublishers(t, pub, 3, 5, true)
	for range 2 {
		time.Sleep(time.Second)
		if err := cluster.Restart(ctx, pgcluster.RestartOptions{Mode: pgcluster.Immediate, Down: 300 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	committed, maybe, order := p.finish()

	waitFor(t, "every committed message in the log", func() bool {
		var n int64
		err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".log WHERE uuid = ANY($1)", keys(committed)).Scan(&n)
		return err == nil && n == int64(len(committed))
	})
	time.Sleep(300 * time.Millisecond) // room for a late duplicate
	checkLogMaybe(t, readLog(t, b, "orders"), committed, maybe, order)
	t.Logf("%d committed, %d with an unanswered COMMIT, %d restarts; relay %+v", len(committed), len(maybe), cluster.Restarts(), r.Stats())
	if cluster.Restarts() != 2 || len(committed) == 0 {
		t.Fatalf("%d restarts, %d committed: the test proved nothing", cluster.Restarts(), len(committed))
	}
}

// The relay is SIGKILLed at random points while publishers write; every
// restart resumes from the position written with the last append, so the
// log ends as 1..n per partition with each committed message once.
func TestRelayKilledAtRandomPointsNumbersEveryMessageOnce(t *testing.T) {
	if os.Getenv("OUTBOX_RELAY_CHILD") != "" {
		t.Skip("running as the child")
	}
	b := setup(t, "orders", 3)
	// Every other relay never confirms a position to the server, so the
	// next one reads again all that was appended since and must skip it.
	start := func(neverConfirm bool) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRelayChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "OUTBOX_RELAY_CHILD=1", pgtest.EnvDatabaseURL+"="+pgtest.DatabaseURL(), "OUTBOX_RELAY_SCHEMA="+b.Schema,
			fmt.Sprintf("OUTBOX_RELAY_NEVER_CONFIRM=%v", neverConfirm))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}

	p := startPublishers(t, walPublisher(t, b), 4, 20, false)
	kills := 0
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for i := range 12 {
		before := b.Int("SELECT count(*) FROM " + b.Schema + ".log")
		cmd := start(i%2 == 1)
		// Mid-stream: once this relay streams the slot and the log has
		// grown since it started (its appends; the publishers never
		// stop), however long its start takes on a busy machine; then
		// at a random point of what it does next.
		instance := fmt.Sprintf(":%d", cmd.Process.Pid)
		waitFor(t, fmt.Sprintf("relay %d (pid %d) to stream and append", i+1, cmd.Process.Pid), func() bool {
			st, err := relay.StatusOf(outboxtest.Ctx(t), b.Pool, b.Schema)
			return err == nil && st.Active && strings.HasSuffix(st.ActiveInstance, instance) &&
				b.Int("SELECT count(*) FROM "+b.Schema+".log") > before
		})
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		if err := cmd.Process.Kill(); err != nil { // SIGKILL: mid-append, mid-read, anywhere
			t.Fatal(err)
		}
		_ = cmd.Wait()
		kills++
	}
	committed, _, order := p.finish()
	if t.Failed() {
		return
	}
	appendedBefore := b.Int("SELECT count(*) FROM " + b.Schema + ".log")
	// A last relay, in this process, takes over (the killed one's walsender
	// may hold the slot a moment: it waits as a standby) and catches up.
	startRelay(t, b.Pool, b.Schema, nil, nil)
	waitLog(t, b, "orders", int64(len(committed)))
	checkLog(t, readLog(t, b, "orders"), committed, order)
	t.Logf("%d messages, %d SIGKILLs, %d appended before the last relay", len(committed), kills, appendedBefore)
}

// TestRelayChild is the relay process of
// TestRelayKilledAtRandomPointsNumbersEveryMessageOnce.
func TestRelayChild(t *testing.T) {
	if os.Getenv("OUTBOX_RELAY_CHILD") == "" {
		t.Skip("only runs as the child of TestRelayKilledAtRandomPointsNumbersEveryMessageOnce")
	}
	relay.NeverConfirm(os.Getenv("OUTBOX_RELAY_NEVER_CONFIRM") == "true")
	cfg := relay.Config{Schema: os.Getenv("OUTBOX_RELAY_SCHEMA"), Pool: pgtest.Pool(t), StandbyRetry: 20 * time.Millisecond, MaxBatch: 50}
	if d := os.Getenv("OUTBOX_RELAY_TAKEOVER"); d != "" {
		var err error
		if cfg.TakeoverTimeout, err = time.ParseDuration(d); err != nil {
			t.Fatal(err)
		}
	}
	if at := os.Getenv("OUTBOX_RELAY_PAUSE_AT"); at != "" {
		var once sync.Once
		relay.PauseAt(func(point string) {
			if point == at {
				once.Do(func() {
					// Frozen until SIGCONT. The stop reaches every thread
					// within milliseconds, not at once: this goroutine waits
					// so that the append cannot move on meanwhile.
					_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
					time.Sleep(500 * time.Millisecond)
				})
			}
		})
	}
	r, err := relay.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A relay frozen in the middle of an append (SIGSTOP: a long GC pause, a
// frozen VM) holds the slot and, with its open transaction, the relays
// row. Within TakeoverTimeout the server ends its stream, its append is
// ended (idle in transaction, or mid-COPY by the next holder) and rolls
// back, and a standby takes over. Woken up, the frozen relay is a zombie
// that appends nothing: the log stays 1..n per partition, each message
// once.
func TestFrozenRelayIsTakenOverAndFencedWhenItWakes(t *testing.T) {
	for _, point := range []string{"advanced", "copy"} {
		t.Run(point, func(t *testing.T) {
			b := setup(t, "orders", 2)
			const takeover = 2 * time.Second
			child := exec.Command(os.Args[0], "-test.run=^TestRelayChild$", "-test.count=1")
			child.Env = append(os.Environ(), "OUTBOX_RELAY_CHILD=1", pgtest.EnvDatabaseURL+"="+pgtest.DatabaseURL(),
				"OUTBOX_RELAY_SCHEMA="+b.Schema, "OUTBOX_RELAY_PAUSE_AT="+point, "OUTBOX_RELAY_TAKEOVER="+takeover.String())
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = child.Process.Kill()
				_ = child.Wait()
			})
			waitFor(t, "the child relay to stream", func() bool {
				st, err := relay.StatusOf(outboxtest.Ctx(t), b.Pool, b.Schema)
				return err == nil && st.Active
			})

			pub := walPublisher(t, b)
			committed, order := map[string]string{}, map[string]int{}
			// The first transaction is large enough (about 200 KB) that the
			// freeze halfway through its COPY comes after pgx has sent the
			// COPY and its first 64 KiB: the server is inside the COPY.
			payload := bytes.Repeat([]byte("p"), 200)
			publish := func(round, n int) {
				var msgs []*message.Message
				for i := range n {
					key := fmt.Sprintf("key-%d", i%4)
					m := message.NewMessage(fmt.Sprintf("r%d-%d", round, i), payload)
					m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
					msgs = append(msgs, m)
					committed[m.UUID] = key
					order[m.UUID] = len(order) + 1
				}
				if err := pub.Publish("orders", msgs...); err != nil {
					t.Fatal(err)
				}
			}
			publish(1, 1000)
			waitFor(t, "the child to freeze in its append at "+point, func() bool {
				stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child.Process.Pid))
				// state is the field after the command name's closing parenthesis
				return err == nil && bytes.Contains(stat, []byte(") T "))
			})
			frozen := time.Now()
			if n := b.Int("SELECT count(*) FROM " + b.Schema + ".log"); n != 0 {
				t.Fatalf("the frozen relay's append is visible: %d messages in the log", n)
			}

			logs := &captureLogger{}
			standby := startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.TakeoverTimeout = takeover }, logs)
			waitLog(t, b, "orders", 1000)
			took := time.Since(frozen)
			t.Logf("frozen at %s: the standby appended %s later", point, took.Round(time.Millisecond))
			if took > 10*takeover {
				t.Fatalf("the standby took %s to take over from a relay frozen at %s (TakeoverTimeout %s)", took, point, takeover)
			}
			if point == "copy" && !logs.has("stopped answering held the slot's append") {
				t.Fatalf("the standby did not end the frozen relay's append session; logged: %v", logs.lines())
			}

			// The zombie wakes up: its stream and its append are gone.
			if err := child.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			publish(2, 10)
			waitLog(t, b, "orders", 1010)
			publish(3, 10)
			waitLog(t, b, "orders", 1020)
			time.Sleep(300 * time.Millisecond) // room for a late duplicate
			checkLog(t, readLog(t, b, "orders"), committed, order)
			if got := standby.Stats().Appended; got != 1020 {
				t.Fatalf("the standby appended %d messages, want all 1020 (the frozen append must have rolled back)", got)
			}
		})
	}
}

// Two relays: one streams, the other waits; when the first stops, the
// standby takes over and later messages reach the log.
func TestStandbyTakesOverWhenTheActiveRelayStops(t *testing.T) {
	b := setup(t, "orders", 2)
	first, err := relay.New(relay.Config{Schema: b.Schema, Pool: b.Pool, StandbyRetry: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Run(context.Background()) }()
	waitFor(t, "the first relay to stream", func() bool { return first.Stats().Active })
	second := startRelay(t, b.Pool, b.Schema, nil, nil)
	pub := walPublisher(t, b)
	if err := pub.Publish("orders", message.NewMessage("a", []byte("1"))); err != nil {
		t.Fatal(err)
	}
	waitLog(t, b, "orders", 1)
	time.Sleep(200 * time.Millisecond) // several standby retries
	if second.Stats().Active || first.Stats().Appended != 1 {
		t.Fatalf("first %+v, second %+v: want the first streaming alone", first.Stats(), second.Stats())
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the standby to take over", func() bool { return second.Stats().Active })
	if err := pub.Publish("orders", message.NewMessage("b", []byte("2"))); err != nil {
		t.Fatal(err)
	}
	waitLog(t, b, "orders", 2)
	if second.Stats().Appended != 1 {
		t.Fatalf("the standby appended %d messages, want 1 (the first one was appended before)", second.Stats().Appended)
	}
}
