package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/backoff/backofftest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/internal/startstop/startstoptest"
)

// stressResult is what the publishing goroutines know for sure.
type stressResult struct {
	mu         sync.Mutex
	committed  map[string]string // uuid -> aggregate key
	rolledBack map[string]bool
}

// runStress publishes from 16 goroutines while `sequencers` sequencers run,
// and checks every guarantee of the sequencer against what committed.
func runStress(t *testing.T, sequencers int) {
	const (
		goroutines = 16
		target     = 20000
		partitions = 16
		keys       = 400
		topic      = "stress"
	)
	e := newEnv(t)
	e.Register(topic, partitions)
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "CREATE TABLE "+e.Schema+".aggregates (key text PRIMARY KEY, version int NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "INSERT INTO "+e.Schema+".aggregates (key) SELECT 'agg-' || g FROM generate_series(1, $1) g", keys); err != nil {
		t.Fatal(err)
	}

	runCtx, stop := context.WithCancel(outboxtest.Ctx(t))
	defer stop()
	var seqWG sync.WaitGroup
	var seqs []*outbox.Sequencer
	for i := 0; i < sequencers; i++ {
		// Small passes over few partitions make racing sequencers interleave.
		s, err := outbox.NewSequencer(outbox.SequencerConfig{
			Schema: e.Schema, Pool: e.Pool, BatchSize: 64 + 32*i, MaxPartitionsPerPass: 4 + i,
			PollInterval: 20 * time.Millisecond, DisableListen: i == 1,
			Alongside: true, // racing in one process, as sequencers of several processes do
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
		seqWG.Add(1)
		go func() {
			defer seqWG.Done()
			if err := s.Run(runCtx); err != nil {
				t.Error(err)
			}
		}()
	}

	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := &stressResult{committed: map[string]string{}, rolledBack: map[string]bool{}}
	var published atomic.Int64
	var pubWG sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		pubWG.Add(1)
		go func() {
			defer pubWG.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			for n := 0; published.Load() < target; n++ {
				if err := publishOne(outboxtest.Ctx(t), e, pub, topic, rng, keys, g, n, res, &published); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	pubWG.Wait()
	if t.Failed() {
		return
	}
	// The race is the point: until each sequencer has won a partition at
	// least once, publish more (a few at a time, as the sequencers run),
	// rather than hope the schedule gave each a turn.
	deadline := time.Now().Add(2 * time.Minute)
	rng := rand.New(rand.NewPCG(uint64(goroutines), 42))
	for n := 0; slices.ContainsFunc(seqs, func(s *outbox.Sequencer) bool { return s.Stats().Sequenced == 0 }); n++ {
		if time.Now().After(deadline) {
			t.Fatal("a sequencer never won a partition: the race was not exercised")
		}
		if err := publishOne(outboxtest.Ctx(t), e, pub, topic, rng, keys, goroutines, n, res, &published); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Let the running sequencers finish the backlog, then stop them.
	for e.Rows("pending") > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sequencers left %d messages pending", e.Rows("pending"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A pass that committed reports its messages when it returns: stop
	// once the reports add up to the log, or a pass whose commit landed
	// as it was cancelled would go uncounted (its error is the cancel).
	logged := int64(len(e.readLog(t, topic)))
	for {
		var reported int64
		for _, s := range seqs {
			reported += s.Stats().Sequenced
		}
		if reported >= logged {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sequencers report %d of the log's %d messages", reported, logged)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	seqWG.Wait()
	var total int64
	for i, s := range seqs {
		st := s.Stats()
		total += st.Sequenced
		t.Logf("sequencer %d: %d messages in %d passes", i, st.Sequenced, st.Passes)
	}

	rows := e.readLog(t, topic)
	if int64(len(rows)) != total {
		t.Errorf("log has %d rows, sequencers report %d", len(rows), total)
	}
	checkStress(t, rows, res)
}

// publishOne runs one transaction: lock an aggregate row, bump its version,
// publish 1-5 messages for it, and commit, roll back (~10%), or hold the
// transaction open for a while before committing (~3%) so that later
// transactions commit first.
func publishOne(c context.Context, e env, pub *outbox.Publisher, topic string, rng *rand.Rand, keys, g, n int, res *stressResult, published *atomic.Int64) error {
	key := "agg-" + strconv.Itoa(1+rng.IntN(keys))
	tx, err := e.Pool.Begin(c)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	var version int
	if err := tx.QueryRow(c, "UPDATE "+e.Schema+".aggregates SET version = version + 1 WHERE key = $1 RETURNING version", key).Scan(&version); err != nil {
		return err
	}
	count := 1 + rng.IntN(5)
	txCtx := outbox.WithTx(c, tx)
	msgs := make([]*message.Message, count)
	for i := range msgs {
		m := message.NewMessage(fmt.Sprintf("g%d-n%d-m%d", g, n, i), []byte(key))
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
		m.Metadata.Set("version", strconv.Itoa(version))
		m.Metadata.Set("index", strconv.Itoa(i))
		m.SetContext(txCtx)
		msgs[i] = m
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		return err
	}
	roll := rng.Float64()
	switch {
	case roll < 0.10:
		if err := tx.Rollback(c); err != nil {
			return err
		}
		res.mu.Lock()
		for _, m := range msgs {
			res.rolledBack[m.UUID] = true
		}
		res.mu.Unlock()
		return nil
	case roll < 0.13:
		// Hold the transaction (and its aggregate row) open while the others
		// commit: its messages got lower ids than rows committed meanwhile.
		time.Sleep(time.Duration(5+rng.IntN(30)) * time.Millisecond)
	}
	if err := tx.Commit(c); err != nil {
		return err
	}
	res.mu.Lock()
	for _, m := range msgs {
		res.committed[m.UUID] = key
	}
	res.mu.Unlock()
	published.Add(int64(count))
	return nil
}

func checkStress(t *testing.T, rows []logRow, res *stressResult) {
	t.Helper()
	if len(res.committed) < 20000 {
		t.Fatalf("only %d messages committed", len(res.committed))
	}
	seen := map[string]bool{}
	nextSeq := map[int]int64{}
	lastVersion := map[string][2]int{} // key -> (version, index) of the previous message
	keyPartition := map[string]int{}
	for _, r := range rows {
		if seen[r.UUID] {
			t.Fatalf("message %s sequenced twice", r.UUID)
		}
		seen[r.UUID] = true
		if res.rolledBack[r.UUID] {
			t.Fatalf("rolled-back message %s was sequenced", r.UUID)
		}
		key, ok := res.committed[r.UUID]
		if !ok {
			t.Fatalf("unknown message %s in the log", r.UUID)
		}
		nextSeq[r.Partition]++
		if r.Seq != nextSeq[r.Partition] {
			t.Fatalf("partition %d: seq %d where %d was due (gap or duplicate)", r.Partition, r.Seq, nextSeq[r.Partition])
		}
		if p, ok := keyPartition[key]; ok && p != r.Partition {
			t.Fatalf("key %s in partitions %d and %d", key, p, r.Partition)
		}
		keyPartition[key] = r.Partition
		// Transactions on one aggregate are serialized by its row lock, so
		// their commit order is their version order: seq must follow it, and
		// messages of one transaction keep their Publish order.
		v, _ := strconv.Atoi(r.Metadata["version"])
		i, _ := strconv.Atoi(r.Metadata["index"])
		prev := lastVersion[key]
		if v < prev[0] || v == prev[0] && i != prev[1]+1 || v > prev[0] && i != 0 {
			t.Fatalf("key %s: message (version %d, #%d) sequenced after (version %d, #%d)", key, v, i, prev[0], prev[1])
		}
		lastVersion[key] = [2]int{v, i}
	}
	for uuid := range res.committed {
		if !seen[uuid] {
			t.Fatalf("committed message %s was never sequenced", uuid)
		}
	}
	t.Logf("%d committed, %d rolled back, %d partitions, all checks hold", len(res.committed), len(res.rolledBack), len(nextSeq))
}

func TestSequencerGapFreeInCommitOrderUnderConcurrency(t *testing.T) {
	t.Parallel()
	runStress(t, 1)
}

func TestTwoSequencersRacingOverTheSamePartitions(t *testing.T) {
	t.Parallel()
	runStress(t, 2)
}

func TestSequencerRunWakesOnNotify(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("wake", 2)
	// A poll interval far beyond the test's deadline: only a notification can
	// make the sequencer pick the message up in time.
	s, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, PollInterval: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	go s.Run(context.Background())
	defer s.Close()
	waitForListener(t, e, e.Schema+"_pending")
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("wake", message.NewMessage("w1", nil)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.Stats().Sequenced != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the notification did not wake the sequencer")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitForListener waits until some session LISTENs on channel.
func waitForListener(t *testing.T, e env, channel string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT count(*) FROM pg_stat_activity WHERE query = $1", `LISTEN "`+channel+`"`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nobody listens on %s", channel)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// unreachablePool is a pool on a port nobody listens on: every statement
// fails at once, and nothing needs a database.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(outboxtest.Ctx(t), "postgres://outbox@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// The Sequencer has the one lifecycle: Run once (a second Run while it
// runs is ErrAlreadyRunning, a Run after Close or after Run returned is
// ErrClosed), Close waits for Run and everything it started, and is
// idempotent.
func TestSequencerRunsOnceAndCloseWaits(t *testing.T) {
	// Not parallel: goleak sees every goroutine of the process.
	ignore := goleak.IgnoreCurrent()
	pool := unreachablePool(t)
	cfg := outbox.SequencerConfig{Schema: "unreachable", Pool: pool, PollInterval: 10 * time.Millisecond}

	closedFirst, err := outbox.NewSequencer(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	startstoptest.CloseThenRun(t, closedFirst)

	s, err := outbox.NewSequencer(cfg, nil) // listening too: its notifier subscription must end with it
	if err != nil {
		t.Fatal(err)
	}
	startstoptest.RunTwiceThenClose(t, s)
	pool.Close()
	goleak.VerifyNone(t, ignore)
}

// A sequencer whose schema was dropped under it retries with the shared
// backoff: the n-th failure in a row waits within [d/2, d] of 100 ms·2^(n-1),
// jittered (before, it waited exactly 50 ms·2^(n-1), capped by
// SequencerConfig.MaxErrorBackoff); a successful pass resets the streak.
func TestSequencerBacksOffWithTheSharedBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	logs := &backofftest.Logger{Msg: "Sequencing failed, retrying"}
	s, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, DisableListen: true, PollInterval: 10 * time.Millisecond}, logs)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	defer func() {
		_ = s.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	pub := e.Publisher(nil)
	if err := pub.Publish("orders", message.NewMessage("m1", nil)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); s.Stats().Sequenced != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the sequencer did not sequence the message")
		}
	}
	pgtest.DropSchemaUnder(t, e.Pool, e.Schema) // the sequencer keeps running
	backofftest.Check(t, backoff.Default, logs.WaitFor(t, 5, 30*time.Second)[:5], outbox.ErrNotMigrated)
}

// A Run that fails at its start (the schema is not migrated) leaves the
// Sequencer as it was: once the schema is migrated, Run runs (before, the
// failed Run left it "running", and every later Run was ErrAlreadyRunning).
func TestSequencerRunsAfterAFailedStart(t *testing.T) {
	t.Parallel()
	b := &outboxtest.Bundle{T: t, Pool: pgtest.Pool(t), Schema: pgtest.Schema(t)} // not migrated yet
	s, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: b.Schema, Pool: b.Pool, PollInterval: 10 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Run(outboxtest.Ctx(t)); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("Run on an unmigrated schema: %v, want ErrNotMigrated", err)
	}
	if err := outbox.Migrate(outboxtest.Ctx(t), b.Pool, b.Schema); err != nil {
		t.Fatal(err)
	}
	b.Register("orders", 1)
	b.Publish("orders", message.NewMessage("m1", nil))
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	for deadline := time.Now().Add(30 * time.Second); s.Stats().Sequenced != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Run after a failed one did not sequence the message")
		}
	}
	_ = s.Close()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A running sequencer vacuums pending itself every 10,000 messages it
// moved (internal/queuevacuum), so that the queue's dead rows do not wait
// for autovacuum's next visit; autovacuum is off for the table here.
func TestSequencerVacuumsPendingAsItGoes(t *testing.T) {
	t.Parallel()
	e := outboxtest.Setup(t)
	e.Register("orders", 4)
	e.Exec("ALTER TABLE " + e.Schema + ".pending SET (autovacuum_enabled = false)")
	s, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, PollInterval: 10 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(outboxtest.Ctx(t))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for range 3 {
		e.PublishN("orders", 4000, "m")
	}
	outboxtest.WaitFor(t, "12,000 messages sequenced", time.Minute, func() bool { return s.Stats().Sequenced == 12000 })
	outboxtest.WaitFor(t, "a vacuum of pending", 30*time.Second, func() bool { return s.Stats().PendingVacuums >= 1 })
}

// One Sequencer per schema and database passes in a process by default: a
// second one (a Subscriber's own beside a pipeline's, say) stands by, and
// takes over when the first stops; with Alongside both run.
func TestOneSequencerPerSchemaPassesInAProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("owned", 2)
	newSeq := func(alongside bool) *outbox.Sequencer {
		s, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, PollInterval: 10 * time.Millisecond, Alongside: alongside}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first, second, third := newSeq(false), newSeq(false), newSeq(true)
	done := make(chan error, 3)
	go func() { done <- first.Run(context.Background()) }()
	outboxtest.WaitFor(t, "the first sequencer owns the schema", 30*time.Second, func() bool {
		e.Publish("owned", message.NewMessage(watermill.NewUUID(), nil))
		return first.Stats().Passes > 0
	})
	go func() { done <- second.Run(context.Background()) }()
	outboxtest.WaitFor(t, "the second stands by", 30*time.Second, func() bool { return second.Stats().Standby })
	for range 20 {
		e.Publish("owned", message.NewMessage(watermill.NewUUID(), nil))
	}
	outboxtest.WaitFor(t, "everything sequenced", 30*time.Second, func() bool { return e.Int("SELECT count(*) FROM "+e.Schema+".pending") == 0 })
	if st := second.Stats(); st.Passes != 0 || !st.Standby {
		t.Fatalf("the second sequencer of the schema passed while the first ran: %+v", st)
	}
	// Asked to, a third runs alongside.
	go func() { done <- third.Run(context.Background()) }()
	outboxtest.WaitFor(t, "the third passes alongside", 30*time.Second, func() bool {
		e.Publish("owned", message.NewMessage(watermill.NewUUID(), nil))
		return third.Stats().Passes > 0
	})
	if err := third.Close(); err != nil {
		t.Fatal(err)
	}
	// The first stops: the second takes over.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "the second takes over", 30*time.Second, func() bool {
		e.Publish("owned", message.NewMessage(watermill.NewUUID(), nil))
		return second.Stats().Passes > 0 && !second.Stats().Standby
	})
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
