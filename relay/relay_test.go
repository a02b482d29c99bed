package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
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
					m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
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
					m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
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
			if got := m.Metadata.Get(outbox.PublishPartitionKeyMetadata); got != committed[m.UUID] {
				t.Fatalf("subscriber: metadata of %s: partition key %q, want %q", m.UUID, got, committed[m.UUID])
			}
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("subscriber: %d of %d delivered", got, len(committed))
		}
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
				m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "k")
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
