package retention_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/retention"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's outbox (see internal/outboxtest) with a publisher and
// a sequencer that do not notify (the tests sequence explicitly).
type env struct {
	*outboxtest.Bundle
	pub *outbox.Publisher
	seq *outbox.Sequencer
}

func newEnv(t *testing.T) env {
	t.Helper()
	b := outboxtest.Setup(t, outboxtest.NoLeaks())
	pub := b.Publisher(func(c *outbox.PublisherConfig) { c.DisableNotify = true })
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: b.Schema, Pool: b.Pool, BatchSize: 20000, DisableNotify: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return env{Bundle: b, pub: pub, seq: seq}
}

func (e env) vacuum(t *testing.T, cfg retention.Config) *retention.Vacuum {
	t.Helper()
	cfg.Schema, cfg.Pool = e.Schema, e.Pool
	v, err := retention.NewVacuum(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close() })
	return v
}

// publish publishes n messages to topic over keys keys (none: spread round
// robin, evenly), in Publish calls of at most 1000, and sequences them.
func (e env) publish(t *testing.T, topic string, n, keys int) {
	t.Helper()
	batch := make([]*message.Message, 0, 1000)
	for i := 0; i < n; i++ {
		m := message.NewMessage(strconv.Itoa(i), []byte("payload"))
		if keys > 0 {
			m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "key-"+strconv.Itoa(i%keys))
		}
		batch = append(batch, m)
		if len(batch) == cap(batch) || i == n-1 {
			if err := e.pub.Publish(topic, batch...); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if _, err := e.seq.SequenceAll(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
}

// createCursors creates group's cursor rows on topic at seq 0, as a
// subscriber's first lease does.
func (e env) createCursors(t *testing.T, group, topic string) {
	t.Helper()
	e.Exec(`INSERT INTO `+e.Schema+`.cursors (group_name, topic, partition)
		SELECT $1, topic, partition FROM `+e.Schema+`.partitions WHERE topic = $2`, group, topic)
}

// advance moves group's cursors on topic to behind messages before each
// partition's end (never below 0 or backwards).
func (e env) advance(t *testing.T, group, topic string, behind int64) {
	t.Helper()
	e.Exec(`UPDATE `+e.Schema+`.cursors c SET seq = greatest(c.seq, p.last_seq - $3), updated_at = clock_timestamp()
		FROM `+e.Schema+`.partitions p
		WHERE c.group_name = $1 AND c.topic = $2 AND p.topic = c.topic AND p.partition = c.partition`, group, topic, behind)
}

func (e env) logRows(t *testing.T, topic string) int64 {
	return e.Int("SELECT count(*) FROM "+e.Schema+".log WHERE topic = $1", topic)
}

// vacuumAll runs passes until one leaves no work, and returns the rows
// deleted.
func vacuumAll(t *testing.T, v *retention.Vacuum) int64 {
	t.Helper()
	var total int64
	for {
		st, err := v.VacuumOnce(outboxtest.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		total += st.Deleted
		if !st.More {
			return total
		}
	}
}

func TestConfigValidate(t *testing.T) {
	pool := pgtest.Pool(t)
	for _, tc := range []struct {
		cfg  retention.Config
		want error
	}{
		{retention.Config{}, outbox.ErrInvalidConfig},
		{retention.Config{Pool: pool, Schema: "-"}, outbox.ErrInvalidName},
		{retention.Config{Pool: pool, ChunkSize: -1}, outbox.ErrInvalidConfig},
		{retention.Config{Pool: pool, MaxChunksPerVisit: -1}, outbox.ErrInvalidConfig},
		{retention.Config{Pool: pool, KeepFor: -time.Second}, outbox.ErrInvalidConfig},
		{retention.Config{Pool: pool, Interval: -time.Second}, outbox.ErrInvalidConfig},
		{retention.Config{Pool: pool}, nil},
	} {
		err := tc.cfg.Validate()
		if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
			t.Errorf("%+v: %v, want %v", tc.cfg, err, tc.want)
		}
		if _, nerr := retention.NewVacuum(tc.cfg, nil); (nerr == nil) != (err == nil) {
			t.Errorf("NewVacuum: %v, Validate: %v", nerr, err)
		}
	}
}

// 200,000 messages published in chunks while two groups consume (one
// close behind, one 250 messages behind per partition): after each chunk
// the log holds exactly what the slower group has not consumed, never
// more; a topic nobody consumes keeps everything.
func TestLogStaysBoundedUnderLoad(t *testing.T) {
	e := newEnv(t)
	const (
		partitions = 8
		chunks     = 20
		perChunk   = 10000
		lag        = 250
	)
	e.Register("load", partitions)
	e.Register("unconsumed", 2)
	e.publish(t, "unconsumed", 500, 10)
	e.createCursors(t, "fast", "load")
	e.createCursors(t, "slow", "load")
	v := e.vacuum(t, retention.Config{ChunkSize: 2000, MaxChunksPerVisit: 2})

	var deleted, maxRows int64
	for c := 0; c < chunks; c++ {
		e.publish(t, "load", perChunk, 64)
		e.advance(t, "fast", "load", 10)
		e.advance(t, "slow", "load", lag)
		deleted += vacuumAll(t, v)

		rows := e.logRows(t, "load")
		want := e.Int(`SELECT sum(p.last_seq - h.horizon) FROM ` + e.Schema + `.partitions p
			JOIN (SELECT topic, partition, min(seq) AS horizon FROM ` + e.Schema + `.cursors GROUP BY 1, 2) h USING (topic, partition)
			WHERE p.topic = 'load'`)
		if rows != want {
			t.Fatalf("after chunk %d: %d rows in the log, want exactly the %d not consumed by every group", c+1, rows, want)
		}
		if rows > partitions*lag {
			t.Fatalf("after chunk %d: %d rows, bound %d", c+1, rows, partitions*lag)
		}
		maxRows = max(maxRows, rows)
		// Nothing above the horizon was touched: the oldest row of each
		// partition is the slow group's next message.
		if bad := e.Int(`SELECT count(*) FROM ` + e.Schema + `.cursors c
			JOIN ` + e.Schema + `.partitions p USING (topic, partition)
			WHERE c.group_name = 'slow' AND c.topic = 'load' AND c.seq < p.last_seq AND NOT EXISTS (
				SELECT 1 FROM ` + e.Schema + `.log l WHERE l.topic = c.topic AND l.partition = c.partition AND l.seq = c.seq + 1)`); bad != 0 {
			t.Fatalf("after chunk %d: %d partitions lost the slow group's next message", c+1, bad)
		}
	}
	total := e.Int(`SELECT sum(last_seq) FROM ` + e.Schema + `.partitions WHERE topic = 'load'`)
	if total != chunks*perChunk || deleted != total-e.logRows(t, "load") {
		t.Fatalf("published %d, deleted %d, left %d", total, deleted, e.logRows(t, "load"))
	}
	if n := e.logRows(t, "unconsumed"); n != 500 {
		t.Fatalf("a topic without groups lost rows: %d left of 500", n)
	}
	t.Logf("%d messages, %d deleted, at most %d rows in the log", total, deleted, maxRows)
}

// A partition is visited only when its horizon moved; a group that has not
// consumed anything (a new group, cursor 0) keeps everything.
func TestVisitsOnlyPartitionsWhoseCursorsMoved(t *testing.T) {
	e := newEnv(t)
	e.Register("t", 4)
	e.publish(t, "t", 400, 0) // 100 per partition
	e.createCursors(t, "a", "t")
	v := e.vacuum(t, retention.Config{})

	st, err := v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil || st.Partitions != 4 || st.Visited != 0 || st.Deleted != 0 {
		t.Fatalf("with every cursor at 0: %+v, %v", st, err)
	}
	e.Exec(`UPDATE ` + e.Schema + `.cursors SET seq = 10 WHERE partition = 1`)
	st, err = v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil || st.Visited != 1 || st.Deleted != 10 {
		t.Fatalf("after partition 1 moved: %+v, %v", st, err)
	}
	st, err = v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil || st.Visited != 0 {
		t.Fatalf("nothing moved: %+v, %v", st, err)
	}

	// A second group at 0 on partition 2 holds it back.
	e.createCursors(t, "b", "t")
	e.Exec(`UPDATE ` + e.Schema + `.cursors SET seq = 20 WHERE group_name = 'a' AND partition IN (1, 2)`)
	st, err = v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil || st.Visited != 0 || st.Deleted != 0 {
		t.Fatalf("group b has consumed nothing: %+v, %v", st, err)
	}
	e.Exec(`UPDATE ` + e.Schema + `.cursors SET seq = 15 WHERE group_name = 'b' AND partition IN (1, 2)`)
	st, err = v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil || st.Visited != 2 || st.Deleted != 5+15 {
		t.Fatalf("after group b moved on 1 and 2: %+v, %v", st, err)
	}
	if got := e.Int(`SELECT min(seq) FROM ` + e.Schema + `.log WHERE topic = 't' AND partition = 2`); got != 16 {
		t.Fatalf("partition 2 starts at %d, want 16", got)
	}
	if s := v.Stats(); s.Passes != 5 || s.Visits != 3 || s.Deleted != 30 {
		t.Fatalf("stats %+v", s)
	}
}

// Large backlogs are deleted in bounded chunks, a bounded number per
// partition and pass, and the pass says work is left.
func TestDeletesInBoundedChunks(t *testing.T) {
	e := newEnv(t)
	e.Register("t", 2)
	e.publish(t, "t", 2000, 0)
	e.createCursors(t, "g", "t")
	e.advance(t, "g", "t", 0)
	v := e.vacuum(t, retention.Config{ChunkSize: 100, MaxChunksPerVisit: 3})
	passes := 0
	for {
		st, err := v.VacuumOnce(outboxtest.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		passes++
		if st.Deleted > 2*300 {
			t.Fatalf("pass %d deleted %d rows, more than 2 partitions x 3 chunks x 100", passes, st.Deleted)
		}
		if !st.More {
			break
		}
	}
	if n := e.logRows(t, "t"); n != 0 || passes < 4 {
		t.Fatalf("%d rows left after %d passes", n, passes)
	}
}

// KeepFor keeps consumed rows until they are old enough.
func TestKeepForKeepsYoungConsumedRows(t *testing.T) {
	e := newEnv(t)
	e.Register("t", 1)
	e.publish(t, "t", 100, 1)
	// The first 60 were sequenced two hours ago.
	e.Exec(`UPDATE ` + e.Schema + `.log SET sequenced_at = now() - interval '2 hours' WHERE seq <= 60`)
	e.createCursors(t, "g", "t")
	e.advance(t, "g", "t", 10) // consumed up to 90
	v := e.vacuum(t, retention.Config{KeepFor: time.Hour})

	st, err := v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil || st.Deleted != 60 {
		t.Fatalf("first pass: %+v, %v; want the 60 old rows deleted", st, err)
	}
	if got := e.Int(`SELECT min(seq) FROM ` + e.Schema + `.log`); got != 61 {
		t.Fatalf("log starts at %d, want 61", got)
	}
	// Nothing became old enough and no cursor moved: no visit.
	if st, err := v.VacuumOnce(outboxtest.Ctx(t)); err != nil || st.Visited != 0 {
		t.Fatalf("second pass: %+v, %v", st, err)
	}
	// Time passes (rows age), the group moves on: the aged consumed rows go,
	// the young and the unconsumed ones stay.
	e.Exec(`UPDATE ` + e.Schema + `.log SET sequenced_at = now() - interval '90 minutes' WHERE seq <= 80`)
	e.advance(t, "g", "t", 0)
	st, err = v.VacuumOnce(outboxtest.Ctx(t))
	if err != nil || st.Deleted != 20 {
		t.Fatalf("third pass: %+v, %v; want rows 61..80", st, err)
	}
	if got := e.logRows(t, "t"); got != 20 {
		t.Fatalf("%d rows left, want 20", got)
	}
}

// A running vacuum never takes a message from a live consumer: every
// message is delivered, in order, and the log ends up empty.
func TestRunAlongsideALiveSubscriber(t *testing.T) {
	e := newEnv(t)
	e.Register("live", 4)
	v := e.vacuum(t, retention.Config{Interval: 20 * time.Millisecond, ChunkSize: 50})
	runDone := make(chan error, 1)
	go func() { runDone <- v.Run(context.Background()) }()

	tune := adaptive.Default()
	tune.BatchSize = 50
	tune.LeaseTTL = 2 * time.Second
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
		Schema: e.Schema, Pool: e.Pool, ConsumerGroup: "g", Tuning: tune, CloseTimeout: time.Second,
		Advanced: outbox.Advanced{PollInterval: 50 * time.Millisecond},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "live")
	if err != nil {
		t.Fatal(err)
	}
	const total = 3000
	go func() {
		for i := 0; i < total; i += 500 {
			batch := make([]*message.Message, 0, 500)
			for j := i; j < i+500; j++ {
				m := message.NewMessage(strconv.Itoa(j), nil)
				m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "k"+strconv.Itoa(j%16))
				batch = append(batch, m)
			}
			if err := e.pub.Publish("live", batch...); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	last := map[string]int{} // key -> last n first delivered
	seen := map[string]bool{}
	for len(seen) < total {
		var m *message.Message
		select {
		case m = <-msgs:
		case <-time.After(30 * time.Second):
			t.Fatalf("stalled after %d messages", len(seen))
		}
		n, _ := strconv.Atoi(m.UUID)
		key := m.Metadata.Get(outbox.PublishPartitionKeyMetadata)
		if !seen[m.UUID] {
			if prev, ok := last[key]; ok && n <= prev {
				t.Fatalf("key %s: %d after %d", key, n, prev)
			}
			last[key] = n
			seen[m.UUID] = true
		}
		m.Ack()
	}
	deadline := time.Now().Add(30 * time.Second)
	for e.logRows(t, "live") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still in the log", e.logRows(t, "live"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	if err := v.Run(context.Background()); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
	if s := v.Stats(); s.Deleted != total {
		t.Fatalf("stats %+v, want %d deleted", s, total)
	}
}

// A large payload lives in bodies (0007_bodies.sql); retention deletes it
// with its log row, and only then: a body whose message is still kept
// stays.
func TestLargePayloadsAreDeletedWithTheirMessages(t *testing.T) {
	e := newEnv(t)
	e.Register("big", 1)
	var msgs []*message.Message
	for i, size := range []int{10, 1024, 5000, 20, 70000, 1024} {
		msgs = append(msgs, message.NewMessage(strconv.Itoa(i), make([]byte, size)))
	}
	if err := e.pub.Publish("big", msgs...); err != nil {
		t.Fatal(err)
	}
	if _, err := e.seq.SequenceAll(outboxtest.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if n := e.Rows("bodies"); n != 4 {
		t.Fatalf("%d bodies after publishing 4 payloads of 1 KiB or more, want 4", n)
	}
	e.createCursors(t, "g", "big")
	e.advance(t, "g", "big", 3) // seq 1..3 consumed: the bodies of 2 and 3 may go
	v := e.vacuum(t, retention.Config{})
	if got := vacuumAll(t, v); got != 3 {
		t.Fatalf("deleted %d messages, want 3", got)
	}
	if n := e.Int("SELECT count(*) FROM " + e.Schema + ".log l JOIN " + e.Schema + ".bodies b ON b.id = l.body_id"); n != 2 {
		t.Fatalf("%d kept messages find their body, want 2 (seq 5 and 6)", n)
	}
	if n := e.Rows("bodies"); n != 2 {
		t.Fatalf("%d bodies kept, want 2", n)
	}
	e.advance(t, "g", "big", 0)
	if got := vacuumAll(t, v); got != 3 {
		t.Fatalf("deleted %d messages, want 3", got)
	}
	if n := e.Rows("bodies"); n != 0 {
		t.Fatalf("%d bodies left after every message was deleted, want 0", n)
	}
}
