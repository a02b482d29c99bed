package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/partitioning"
	"github.com/millrace/watermill-outbox/relay"
)

// The tests run on a throwaway cluster with wal_level = logical. Its
// commits do not wait for the WAL to be flushed, and the WAL writer
// flushes every 10 ms (not 200), so the slot streams each commit about
// as soon as a durable server would.
func TestMain(m *testing.M) {
	pgtest.MainWith(m, pgcluster.Options{Settings: map[string]string{
		"wal_level": "logical", "max_replication_slots": "40", "max_wal_senders": "40", "wal_writer_delay": "10ms",
	}})
}

// setup migrates a schema, creates its slot (dropped at the end) and
// registers topic.
func setup(t *testing.T, topic string, partitions int) *outboxtest.Bundle {
	t.Helper()
	b := outboxtest.Setup(t)
	b.Register(topic, partitions)
	if err := relay.CreateSlot(outboxtest.Ctx(t), b.Pool, b.Schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for ctx.Err() == nil { // (a killed child's walsender may still hold the slot a moment)
			if err := relay.DropSlot(ctx, b.Pool, b.Schema, true); err == nil || !errors.Is(err, relay.ErrSlotActive) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	return b
}

// startRelay runs a relay of schema until the test ends.
func startRelay(t *testing.T, pool *pgxpool.Pool, schema string, edit func(*relay.Config), logger watermill.LoggerAdapter) *relay.Relay {
	t.Helper()
	cfg := relay.Config{Schema: schema, Pool: pool, StandbyRetry: 50 * time.Millisecond}
	if edit != nil {
		edit(&cfg)
	}
	r, err := relay.New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = r.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

func walPublisher(t *testing.T, b *outboxtest.Bundle) *outbox.Publisher {
	return b.Publisher(func(c *outbox.PublisherConfig) { c.Mode = outbox.ModeWAL })
}

// publishers publish into "orders" until finish: each its own key, in
// transactions of 1 to maxPerTx messages.
type publishers struct {
	mu                sync.Mutex
	committed, unsure map[string]string // uuid → key
	order             map[string]int    // uuid → place in the order published
	stop              chan struct{}
	wg                sync.WaitGroup
}

// startPublishers starts n publishers on pub. A failed Publish fails the
// test, unless failuresExpected (the server is being crashed): then its
// messages count as unsure (the COMMIT may have landed) and the publisher
// waits a moment and goes on.
func startPublishers(t *testing.T, pub *outbox.Publisher, n, maxPerTx int, failuresExpected bool) *publishers {
	p := &publishers{committed: map[string]string{}, unsure: map[string]string{}, order: map[string]int{}, stop: make(chan struct{})}
	for w := range n {
		p.wg.Go(func() {
			key := fmt.Sprintf("key-%d", w)
			for i := 0; ; i++ {
				select {
				case <-p.stop:
					return
				default:
				}
				var msgs []*message.Message
				for j := range 1 + i%maxPerTx {
					m := message.NewMessage(fmt.Sprintf("%d-%d-%d", w, i, j), []byte("x"))
					m.Metadata.Set(outbox.PartitionKeyMetadata, key)
					msgs = append(msgs, m)
				}
				err := pub.Publish("orders", msgs...)
				if err != nil && !failuresExpected {
					t.Error(err)
					return
				}
				p.mu.Lock()
				for _, m := range msgs {
					if err == nil {
						p.committed[m.UUID] = key
					} else {
						p.unsure[m.UUID] = key
					}
					p.order[m.UUID] = len(p.order) + 1
				}
				p.mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond) // the server is down
				} else {
					time.Sleep(2 * time.Millisecond)
				}
			}
		})
	}
	return p
}

// finish stops the publishers and returns what they published: committed
// and unsure (uuid → key), and the order published (uuid → place).
func (p *publishers) finish() (committed, unsure map[string]string, order map[string]int) {
	close(p.stop)
	p.wg.Wait()
	return p.committed, p.unsure, p.order
}

// waitLog waits until the log holds n messages of topic.
func waitLog(t *testing.T, b *outboxtest.Bundle, topic string, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := b.Int("SELECT count(*) FROM "+b.Schema+".log WHERE topic = $1", topic)
		if got == n {
			return
		}
		if got > n || time.Now().After(deadline) {
			t.Fatalf("the log holds %d messages of %s, want %d", got, topic, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type logged struct {
	partition int
	seq       int64
	uuid, key string
	payload   []byte
}

func readLog(t *testing.T, b *outboxtest.Bundle, topic string) []logged {
	t.Helper()
	rows, err := b.Pool.Query(outboxtest.Ctx(t), `SELECT l.partition, l.seq, l.uuid, coalesce(l.partition_key, ''), coalesce(l.payload, bd.payload)
		FROM `+b.Schema+`.log l LEFT JOIN `+b.Schema+`.bodies bd ON bd.id = l.body_id WHERE l.topic = $1 ORDER BY l.partition, l.seq`, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []logged
	for rows.Next() {
		var r logged
		if err := rows.Scan(&r.partition, &r.seq, &r.uuid, &r.key, &r.payload); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkLog asserts that the log of topic holds exactly the committed
// messages (uuid → key), each once, with seq 1..n in every partition and,
// per key, in the order given by order (uuid → position in its key).
func checkLog(t *testing.T, rows []logged, committed map[string]string, order map[string]int) {
	t.Helper()
	checkLogMaybe(t, rows, committed, nil, order)
}

// checkLogMaybe is checkLog where the messages of maybe (uuid → key: their
// COMMIT got no answer, so they may have committed or not) may be in the
// log, once, or not at all.
func checkLogMaybe(t *testing.T, rows []logged, committed, maybe map[string]string, order map[string]int) {
	t.Helper()
	seen := map[string]bool{}
	found := 0
	next := map[int]int64{}
	lastPos := map[string]int{}
	for _, r := range rows {
		if next[r.partition]++; r.seq != next[r.partition] {
			t.Fatalf("partition %d: seq %d where %d was due (a gap or a repeat)", r.partition, r.seq, next[r.partition])
		}
		key, ok := committed[r.uuid]
		if ok {
			found++
		} else if key, ok = maybe[r.uuid]; !ok {
			t.Fatalf("message %s is in the log but was never committed", r.uuid)
		}
		if seen[r.uuid] {
			t.Fatalf("message %s is in the log twice", r.uuid)
		}
		seen[r.uuid] = true
		if key != r.key {
			t.Fatalf("message %s: key %q, want %q", r.uuid, r.key, key)
		}
		if pos, ok := order[r.uuid]; ok && key != "" {
			if pos <= lastPos[key] && lastPos[key] != 0 {
				t.Fatalf("key %s: message %s (position %d) after position %d", key, r.uuid, pos, lastPos[key])
			}
			lastPos[key] = pos
		}
	}
	if found != len(committed) {
		t.Fatalf("the log holds %d of the %d committed messages", found, len(committed))
	}
}

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

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Messages published in ModeWAL reach the log once each, gap-free per
// partition, in commit order per key, with their bytes exact, large
// payloads in bodies; rolled-back transactions leave nothing; table-mode
// messages of the same topic, sequenced at the same time, interleave
// without a gap.
func TestRelayAppendsCommittedMessagesGapFreeInCommitOrder(t *testing.T) {
	b := setup(t, "orders", 4)
	startRelay(t, b.Pool, b.Schema, nil, nil)
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	seqDone := make(chan error, 1)
	go func() { seqDone <- seq.Run(context.Background()) }()
	defer func() { _ = seq.Close(); <-seqDone }()

	walPub, tablePub := walPublisher(t, b), b.Publisher(nil)
	var mu sync.Mutex
	committed, order, payloads := map[string]string{}, map[string]int{}, map[string][]byte{}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pub := walPub
			if w == 5 {
				pub = tablePub // one writer in table mode, same topic and keys
			}
			key := fmt.Sprintf("key-%d", w)
			for i := range 60 {
				var msgs []*message.Message
				for j := range 1 + i%5 {
					size := (i*7 + j) % 3 * 700 // 0, 700, 1400 bytes: inline and in bodies
					payload := bytes.Repeat([]byte{byte(w), byte(i), byte(j)}, size/3+1)
					m := message.NewMessage(fmt.Sprintf("%d-%d-%d", w, i, j), payload)
					m.Metadata.Set(outbox.PartitionKeyMetadata, key)
					msgs = append(msgs, m)
				}
				rollback := i%7 == 3
				tx, err := b.Pool.Begin(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				for _, m := range msgs {
					m.SetContext(outbox.WithTx(context.Background(), tx))
				}
				if err := pub.Publish("orders", msgs...); err != nil {
					t.Error(err)
					_ = tx.Rollback(context.Background())
					return
				}
				if rollback {
					_ = tx.Rollback(context.Background())
					continue
				}
				if err := tx.Commit(context.Background()); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, m := range msgs {
					committed[m.UUID], payloads[m.UUID] = key, m.Payload
					order[m.UUID] = len(order) + 1
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	waitLog(t, b, "orders", int64(len(committed)))
	rows := readLog(t, b, "orders")
	checkLog(t, rows, committed, order)
	for _, r := range rows {
		if !bytes.Equal(r.payload, payloads[r.uuid]) {
			t.Fatalf("message %s: payload of %d bytes differs from the %d published", r.uuid, len(r.payload), len(payloads[r.uuid]))
		}
	}
	if n := b.Int("SELECT count(*) FROM " + b.Schema + ".log WHERE body_id IS NOT NULL"); n == 0 {
		t.Fatal("no message of 1 KiB or more went into bodies")
	}
	if n := b.Rows("pending"); n != 0 {
		t.Fatalf("%d rows left in pending", n)
	}

	// A Subscriber reads them as it reads the Sequencer's.
	sub := b.Subscriber("readers", nil)
	ch, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	for got := 0; got < len(committed); got++ {
		select {
		case m := <-ch:
			if !bytes.Equal(m.Payload, payloads[m.UUID]) {
				t.Fatalf("subscriber: payload of %s differs", m.UUID)
			}
			if got := m.Metadata.Get(outbox.PartitionKeyMetadata); got != committed[m.UUID] {
				t.Fatalf("subscriber: metadata of %s: partition key %q, want %q", m.UUID, got, committed[m.UUID])
			}
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("subscriber: %d of %d delivered", got, len(committed))
		}
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
		cmd := start(i%2 == 1)
		time.Sleep(time.Duration(100+rng.IntN(500)) * time.Millisecond)
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
	if appendedBefore == 0 {
		t.Fatal("the killed relays appended nothing: the kills did not land mid-stream")
	}
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
					m.Metadata.Set(outbox.PartitionKeyMetadata, key)
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

// A transaction whose partition is not registered (its row deleted by
// hand, as a dropped topic would leave it) is not half-appended, by the
// one-statement append of small batches and by the COPY of large ones: the
// relay says which partition, appends nothing, moves neither the
// partitions nor its position, and retries; once the partition is back,
// the messages are appended from seq 1.
func TestUnregisteredPartitionAppendsNothingAndSaysWhich(t *testing.T) {
	for _, size := range []int{3, 500} {
		t.Run(fmt.Sprintf("%d messages", size), func(t *testing.T) {
			b := setup(t, "orders", 2)
			pub := walPublisher(t, b)
			committed, order := map[string]string{}, map[string]int{}
			var msgs []*message.Message
			for i := range size {
				m := message.NewMessage(fmt.Sprintf("m-%d", i), []byte("x"))
				m.Metadata.Set(outbox.PartitionKeyMetadata, "k")
				msgs = append(msgs, m)
				committed[m.UUID], order[m.UUID] = "k", i+1
			}
			if err := pub.Publish("orders", msgs...); err != nil {
				t.Fatal(err)
			}
			part, err := partitioning.Default().Partition("k", 2)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Pool.Exec(outboxtest.Ctx(t), "DELETE FROM "+b.Schema+".partitions WHERE topic = $1 AND partition = $2", "orders", part); err != nil {
				t.Fatal(err)
			}
			logs := &captureLogger{}
			r := startRelay(t, b.Pool, b.Schema, nil, logs)
			want := fmt.Sprintf("topic partitions not registered: orders partition %d (", part)
			waitFor(t, "the relay to say the partition is not registered", func() bool { return logs.has(want) })
			if st := r.Stats(); st.Failures == 0 || !strings.Contains(st.LastError, want) {
				t.Fatalf("Stats of a relay failing on an unregistered partition: %+v", st)
			}
			if n := b.Int("SELECT count(*) FROM " + b.Schema + ".log"); n != 0 {
				t.Fatalf("%d messages in the log of an unregistered partition", n)
			}
			if lsn := b.Int("SELECT lsn FROM " + b.Schema + ".relays"); lsn != 0 {
				t.Fatalf("the relay's position moved to %d without an append", lsn)
			}
			if seq := b.Int("SELECT coalesce(max(last_seq), 0) FROM " + b.Schema + ".partitions"); seq != 0 {
				t.Fatalf("a partition advanced to %d without an append", seq)
			}
			if _, err := b.Pool.Exec(outboxtest.Ctx(t), "INSERT INTO "+b.Schema+".partitions (topic, partition) VALUES ($1, $2)", "orders", part); err != nil {
				t.Fatal(err)
			}
			waitLog(t, b, "orders", int64(size))
			checkLog(t, readLog(t, b, "orders"), committed, order)
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

// A relay restarted where the slot still points before what was appended
// (it never confirmed) reads those transactions again and skips them: the
// position written with each append decides, not the slot's.
func TestRestartedRelaySkipsWhatWasAppended(t *testing.T) {
	b := setup(t, "orders", 2)
	relay.NeverConfirm(true)
	defer relay.NeverConfirm(false)
	pub := walPublisher(t, b)
	committed := map[string]string{}
	publish := func(prefix string, n int) {
		for i := range n {
			m := message.NewMessage(fmt.Sprintf("%s-%d", prefix, i), []byte("x"))
			if err := pub.Publish("orders", m); err != nil {
				t.Fatal(err)
			}
			committed[m.UUID] = ""
		}
	}
	for round := range 3 {
		publish(fmt.Sprint(round), 40)
		r, err := relay.New(relay.Config{Schema: b.Schema, Pool: b.Pool}, nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		waitLog(t, b, "orders", int64(len(committed)))
		time.Sleep(100 * time.Millisecond) // time to append anything twice
		_ = r.Close()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := r.Stats().Appended; got != 40 {
			t.Fatalf("round %d: the relay appended %d messages, want the 40 new ones", round, got)
		}
	}
	checkLog(t, readLog(t, b, "orders"), committed, nil)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The slot's retained WAL is visible while no relay runs, the relay warns
// past WarnRetainedWAL, and once it has appended, the confirmed position
// covers what it appended; DropSlot refuses while a relay streams.
func TestSlotStatusRetainedWALAndDrop(t *testing.T) {
	b := setup(t, "orders", 1)
	st, err := relay.StatusOf(outboxtest.Ctx(t), b.Pool, b.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Exists || st.Active || st.Slot != relay.Slot(b.Schema) {
		t.Fatalf("status after CreateSlot: %+v", st)
	}
	pub := walPublisher(t, b)
	var msgs []*message.Message
	for i := range 500 {
		msgs = append(msgs, message.NewMessage(fmt.Sprint(i), make([]byte, 2000)))
	}
	if err := pub.Publish("orders", msgs...); err != nil {
		t.Fatal(err)
	}
	st, err = relay.StatusOf(outboxtest.Ctx(t), b.Pool, b.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if st.RetainedWALBytes < 500*2000 {
		t.Fatalf("retained WAL %d bytes after 1 MB published with no relay, want at least that", st.RetainedWALBytes)
	}
	// The operators' status says the same.
	adm, err := admin.New(admin.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := adm.Status(outboxtest.Ctx(t), admin.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if w := rep.WALSlot; w == nil || w.Active || w.Slot != st.Slot || w.RetainedWALBytes < 500*2000 {
		t.Fatalf("admin status of the slot with no relay: %+v", rep.WALSlot)
	}
	// And the console's overview, in words an operator acts on.
	page := consoleOverview(t, b)
	for _, want := range []string{"Replication slot <b>" + st.Slot + "</b>", "no relay streams it", "of WAL retained", `class="warn"`} {
		if !strings.Contains(page, want) {
			t.Fatalf("console overview lacks %q:\n%s", want, page)
		}
	}

	logs := &captureLogger{}
	r := startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.WarnRetainedWAL = 1000 }, logs)
	waitLog(t, b, "orders", 500)
	if !logs.has("keeps more WAL than WarnRetainedWAL") {
		t.Fatalf("no warning about the retained WAL; logged: %v", logs.lines())
	}
	st, err = r.Status(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Active || st.AppendedLSN == 0 {
		t.Fatalf("status while streaming: %+v", st)
	}
	if rep, err = adm.Status(outboxtest.Ctx(t), admin.Filter{}); err != nil || rep.WALSlot == nil || !rep.WALSlot.Active {
		t.Fatalf("admin status of the slot while a relay streams: %+v, %v", rep.WALSlot, err)
	}
	if page := consoleOverview(t, b); !strings.Contains(page, "a relay streams it") || strings.Contains(page, "no relay streams it") {
		t.Fatalf("console overview while a relay streams:\n%s", page)
	}
	waitFor(t, "the confirmed position to pass the last append", func() bool {
		st, err = r.Status(outboxtest.Ctx(t))
		return err == nil && st.ConfirmedLSN > st.AppendedLSN
	})
	for _, force := range []bool{false, true} {
		if err := relay.DropSlot(outboxtest.Ctx(t), b.Pool, b.Schema, force); !errors.Is(err, relay.ErrSlotActive) {
			t.Fatalf("DropSlot (force %v) while a relay streams: %v, want ErrSlotActive", force, err)
		}
	}
}

// A server without wal_level = logical, a role without the replication
// privilege and a missing slot each get their typed error, saying what to
// change, from CreateSlot and from Run.
func TestPrerequisitesGetTypedErrors(t *testing.T) {
	b := outboxtest.Setup(t)
	ctx := outboxtest.Ctx(t)

	// A missing slot.
	r, err := relay.New(relay.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, relay.ErrNoSlot) || !strings.Contains(err.Error(), "CreateSlot") {
		t.Fatalf("Run without a slot: %v, want ErrNoSlot naming CreateSlot", err)
	}

	// A role without REPLICATION.
	role := "norepl_" + b.Schema
	b.Exec("CREATE ROLE " + role + " LOGIN")
	b.Exec("GRANT USAGE ON SCHEMA " + b.Schema + " TO " + role)
	t.Cleanup(func() {
		_, _ = b.Pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = b.Pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	cfg := b.Pool.Config().Copy()
	cfg.ConnConfig.User = role
	weak, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer weak.Close()
	if err := relay.CreateSlot(ctx, weak, b.Schema); !errors.Is(err, relay.ErrReplicationPrivilege) || !strings.Contains(err.Error(), "ALTER ROLE") {
		t.Fatalf("CreateSlot as a role without REPLICATION: %v, want ErrReplicationPrivilege", err)
	}

	// A server with wal_level = replica (its default).
	plain, _ := outboxtest.OwnCluster(t, nil, "plain")
	if err := relay.CreateSlot(ctx, plain.Pool, "plain"); !errors.Is(err, relay.ErrWALLevel) || !strings.Contains(err.Error(), "wal_level = logical") {
		t.Fatalf("CreateSlot with wal_level = replica: %v, want ErrWALLevel", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  relay.Config
		want error
	}{
		{relay.Config{}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, Schema: "Bad-Name"}, outbox.ErrInvalidName},
		{relay.Config{Pool: &pgxpool.Pool{}, MaxBatch: -1}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, StandbyRetry: -time.Second}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, Instance: strings.Repeat("x", relay.MaxInstanceLen+1)}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, Instance: "relay\x1b[2J"}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, Instance: "réplica"}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, Instance: strings.Repeat("x", relay.MaxInstanceLen)}, nil},
		{relay.Config{Pool: &pgxpool.Pool{}}, nil},
	} {
		if err := tc.cfg.Validate(); !errors.Is(err, tc.want) && !(err == nil && tc.want == nil) {
			t.Errorf("%+v: %v, want %v", tc.cfg, err, tc.want)
		}
	}
	if _, err := outbox.NewPublisher(outbox.PublisherConfig{Mode: 7}, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("Publisher Mode 7: %v, want ErrInvalidConfig", err)
	}
}

// captureLogger keeps what is logged.
type captureLogger struct {
	mu  sync.Mutex
	got []string
}

func (l *captureLogger) add(msg string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, fmt.Sprint(msg, " ", err))
}
func (l *captureLogger) Error(msg string, err error, _ watermill.LogFields) { l.add(msg, err) }
func (l *captureLogger) Info(msg string, _ watermill.LogFields)             { l.add(msg, nil) }
func (l *captureLogger) Debug(string, watermill.LogFields)                  {}
func (l *captureLogger) Trace(string, watermill.LogFields)                  {}
func (l *captureLogger) With(watermill.LogFields) watermill.LoggerAdapter   { return l }
func (l *captureLogger) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}
func (l *captureLogger) has(s string) bool {
	for _, line := range l.lines() {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// consoleOverview returns the web console's overview page of b's schema.
func consoleOverview(t *testing.T, b *outboxtest.Bundle) string {
	t.Helper()
	c, err := console.New(console.Config{Pool: b.Pool, Schema: b.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /: %d, %v", resp.StatusCode, err)
	}
	return string(body)
}
