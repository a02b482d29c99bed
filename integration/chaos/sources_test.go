package chaos

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// TestChaosSources proves one pipeline.Fleet over several databases (issue
// 31): three throwaway PostgreSQL servers, each a shard with the same
// schema, topic (4 partitions, the same incarnation) and consumer group,
// so their messages have the same outbox ids; publishers commit, roll back and fail on each; two
// fleet processes (pipeline.Fleet over the three, exactly once into one
// Kafka topic of 4 partitions) are SIGKILLed every 0.5-1.5 s and frozen
// past their leases every few seconds; one server is restarted in
// immediate mode (a crash) in the middle. Then it drains and reads the
// Kafka topic back, read_committed: every committed message of every
// source exactly once, none rolled back, each key's messages in its
// order, and every record's header outbox_source naming the database its
// message was committed in.
//
//	go test ./integration/chaos -run TestChaosSources -v [-chaos.duration=2m -chaos.seed=N]
func TestChaosSources(t *testing.T) {
	if _, child, _ := ChildFromEnv(); child {
		t.Skip("a child process")
	}
	dur := 25 * time.Second
	if flagSet("chaos.duration") {
		dur = *flagDuration
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (again: -chaos.seed=%d), duration %v", seed, seed, dur)
	r := newSourcesRun(t, seed)
	r.setUp()
	r.storm(dur)
	r.drain(2 * time.Minute)
	for _, p := range r.procs {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("stop %s: %v", p.Name, err)
		}
	}
	r.verify()
}

// The fleet's settings.
const (
	sourcesPartitions = 4
	sourcesKeys       = 16 // per source
	sourcesGroup      = "chaos-fleet"
	sourcesFleets     = 2
)

var sourceNames = []string{"eu", "us", "apac"}

// shard is one database of a sources run.
type shard struct {
	name    string
	cluster *pgcluster.Cluster
	url     string
	pool    *pgxpool.Pool
	pub     *outbox.Publisher
}

// sourcesRun is one run of TestChaosSources.
type sourcesRun struct {
	t      *testing.T
	seed   uint64
	dir    string
	shards map[string]*shard
	kafka  *kafkatest.Cluster
	topic  string // the Kafka topic
	procs  []*Proc

	mu   sync.Mutex
	msgs []sourceMessage

	committed, restarts, kills, freezes atomic.Int64
}

// sourceMessage is a message a publisher tried to publish, and what
// became of its transaction.
type sourceMessage struct {
	Source, Key, UUID, Tx string
	N                     int
	Status                Status
}

// sourcePayload is the body of every message of the run.
type sourcePayload struct {
	ID     string `json:"id"`
	Source string `json:"source"`
	Key    string `json:"key"`
	N      int    `json:"n"`
}

func newSourcesRun(t *testing.T, seed uint64) *sourcesRun {
	dir, err := os.MkdirTemp("", "outbox-chaos-sources-")
	if err != nil {
		t.Fatal(err)
	}
	r := &sourcesRun{t: t, seed: seed, dir: dir, shards: map[string]*shard{}}
	t.Cleanup(func() {
		for _, p := range r.procs {
			p.Kill()
		}
		if t.Failed() || *flagKeep {
			t.Logf("logs of the run: %s", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	})
	return r
}

func (r *sourcesRun) setUp() {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, name := range sourceNames {
		logFile, err := os.Create(filepath.Join(r.dir, "postgres-"+name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = logFile.Close() })
		var logMu sync.Mutex
		cluster, err := pgtest.StartCluster(ctx, pgcluster.Options{
			Settings: map[string]string{"synchronous_commit": "on"}, // acknowledged commits survive the crash
			Log: func(line string) {
				logMu.Lock()
				defer logMu.Unlock()
				fmt.Fprintln(logFile, line)
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cluster.Stop)
		s := &shard{name: name, cluster: cluster, url: cluster.URL("")}
		pcfg, err := pgxpool.ParseConfig(s.url)
		if err != nil {
			t.Fatal(err)
		}
		pcfg.MaxConns = 8
		pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
		if s.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.pool.Close)
		if err := outbox.Migrate(ctx, s.pool, schema); err != nil {
			t.Fatal(err)
		}
		if err := outbox.RegisterTopic(ctx, s.pool, schema, topic, sourcesPartitions); err != nil {
			t.Fatal(err)
		}
		// The shards are clones (made from one template database, or
		// restored from one dump, as shards often are): their topic has
		// the same registration time, so the same incarnation, and only
		// the source tells their records apart.
		if _, err := s.pool.Exec(ctx, `UPDATE `+schema+`.topics SET created_at = '2026-01-01T00:00:00Z' WHERE name = $1`, topic); err != nil {
			t.Fatal(err)
		}
		if _, err := s.pool.Exec(ctx, fmt.Sprintf(`
			CREATE TABLE %[1]s.chaos_keys (key text PRIMARY KEY, n int NOT NULL);
			INSERT INTO %[1]s.chaos_keys SELECT '%[2]s-k' || lpad(i::text, 2, '0'), 0 FROM generate_series(0, %[3]d) i;
			CREATE TABLE %[1]s.chaos_txs (tx text PRIMARY KEY)`, schema, name, sourcesKeys-1)); err != nil {
			t.Fatal(err)
		}
		if s.pub, err = outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: s.pool}, nil); err != nil {
			t.Fatal(err)
		}
		r.shards[name] = s
	}

	r.kafka = kafkatest.New(t)
	r.topic = r.kafka.Topic(t, "chaos-sources", sourcesPartitions, nil)
	id := make([]byte, 4)
	_, _ = crand.Read(id)
	urls := map[string]string{}
	for name, s := range r.shards {
		urls[name] = s.url
	}
	for i := 1; i <= sourcesFleets; i++ {
		cfg := ChildConfig{Role: RoleFleet, Name: fmt.Sprintf("fleet-%d", i), Schema: schema, Topic: topic, Group: sourcesGroup,
			Sources: urls, Brokers: r.kafka.Brokers, KafkaTopic: r.topic, TransactionalIDPrefix: "chaos-" + hex.EncodeToString(id),
			LeaseTTL: leaseTTL, Seed: r.seed}
		env, err := ChildEnv(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p := NewProc(cfg.Name, RoleFleet, os.Args[0], []string{"-test.run=^TestChaosChild$", "-test.count=1", "-test.timeout=0"}, []string{env}, r.dir)
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		r.procs = append(r.procs, p)
	}
}

// storm publishes on every source for dur while it kills and freezes the
// fleet processes and crashes one server.
func (r *sourcesRun) storm(dur time.Duration) {
	t := r.t
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	for i, name := range sourceNames {
		for p := range 2 {
			wg.Go(func() { r.publish(ctx, r.shards[name], r.rng(uint64(10+i*2+p)), fmt.Sprintf("%s-p%d", name, p)) })
		}
	}
	var busy sync.Map // *Proc being killed or frozen
	// One server crashes, at 30-50% of the run, down 1-2 s.
	wg.Go(func() {
		rng := r.rng(1)
		victim := r.shards[sourceNames[rng.IntN(len(sourceNames))]]
		at := time.Duration(float64(dur) * (0.3 + 0.2*rng.Float64()))
		down := time.Duration(1000+rng.IntN(1000)) * time.Millisecond
		if !sleep(ctx, at) {
			return
		}
		t.Logf("%5.1fs: PostgreSQL of %s: immediate restart (down %v)", time.Since(start).Seconds(), victim.name, down)
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer rcancel()
		if err := victim.cluster.Restart(rctx, pgcluster.RestartOptions{Mode: pgcluster.Immediate, Down: down}); err != nil {
			t.Errorf("restart %s: %v", victim.name, err)
			return
		}
		r.restarts.Add(1)
	})
	// Kills: a fleet process every 0.5-1.5 s, started again within 0.5 s.
	wg.Go(func() {
		rng := r.rng(2)
		var kw sync.WaitGroup
		defer kw.Wait()
		for sleep(ctx, time.Duration(500+rng.IntN(1000))*time.Millisecond) {
			p := r.procs[rng.IntN(len(r.procs))]
			if _, inUse := busy.LoadOrStore(p, true); inUse {
				continue
			}
			delay := time.Duration(rng.IntN(500)) * time.Millisecond
			kw.Go(func() {
				defer busy.Delete(p)
				if p.Kill() {
					r.kills.Add(1)
				}
				time.Sleep(delay)
				if err := p.Start(); err != nil {
					t.Errorf("restart %s: %v", p.Name, err)
				}
			})
		}
	})
	// Freezes: every 3-6 s a fleet process stops (SIGSTOP) for longer than
	// its leases and wakes up as a zombie.
	wg.Go(func() {
		rng := r.rng(3)
		var fw sync.WaitGroup
		defer fw.Wait()
		for sleep(ctx, time.Duration(3000+rng.IntN(3000))*time.Millisecond) {
			p := r.procs[rng.IntN(len(r.procs))]
			if _, inUse := busy.LoadOrStore(p, true); inUse {
				continue
			}
			d := leaseTTL + time.Duration(500+rng.IntN(2000))*time.Millisecond
			fw.Go(func() {
				defer busy.Delete(p)
				if p.Pause(d) {
					r.freezes.Add(1)
				}
			})
		}
	})
	wg.Wait()
	for _, p := range r.procs {
		if err := p.Start(); err != nil {
			t.Fatalf("restart %s: %v", p.Name, err)
		}
	}
	t.Logf("%5.1fs: storm over: %d transactions committed, %d SIGKILLs, %d freezes, %d server crash; draining",
		time.Since(start).Seconds(), r.committed.Load(), r.kills.Load(), r.freezes.Load(), r.restarts.Load())
}

func (r *sourcesRun) rng(stream uint64) *rand.Rand { return rand.New(rand.NewPCG(r.seed, stream)) }

// publish runs transactions on s until ctx ends: one key, one or two
// messages numbered by the key's counter; 10% rolled back on purpose.
func (r *sourcesRun) publish(ctx context.Context, s *shard, rng *rand.Rand, name string) {
	for i := 0; sleep(ctx, time.Duration(5+rng.IntN(15))*time.Millisecond); i++ {
		txID := fmt.Sprintf("%s-%d", name, i)
		key := fmt.Sprintf("%s-k%02d", s.name, rng.IntN(sourcesKeys))
		count := 1 + rng.IntN(2)
		rollback := rng.Float64() < 0.1
		msgs, err := r.publishTx(s, txID, key, count, rollback)
		status := Committed
		switch {
		case errors.Is(err, errInDoubt):
			status = InDoubt
		case err != nil || rollback:
			status = RolledBack
		default:
			r.committed.Add(1)
		}
		r.mu.Lock()
		for _, m := range msgs {
			m.Status = status
			r.msgs = append(r.msgs, m)
		}
		r.mu.Unlock()
	}
}

func (r *sourcesRun) publishTx(s *shard, txID, key string, count int, rollback bool) ([]sourceMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var n int
	if err := tx.QueryRow(ctx, `UPDATE `+schema+`.chaos_keys SET n = n + $2 WHERE key = $1 RETURNING n`, key, count).Scan(&n); err != nil {
		return nil, err
	}
	var msgs []sourceMessage
	var batch []*message.Message
	for j := range count {
		m := sourceMessage{Source: s.name, Key: key, UUID: fmt.Sprintf("%s-%d", txID, j), Tx: txID, N: n - count + 1 + j}
		body, _ := json.Marshal(sourcePayload{ID: m.UUID, Source: s.name, Key: key, N: m.N})
		wm := message.NewMessage(m.UUID, body)
		wm.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
		wm.SetContext(outbox.WithTx(ctx, tx))
		batch = append(batch, wm)
		msgs = append(msgs, m)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.chaos_txs VALUES ($1)`, txID); err != nil {
		return msgs, err
	}
	if err := s.pub.Publish(topic, batch...); err != nil {
		return msgs, err
	}
	if rollback {
		return msgs, tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return msgs, fmt.Errorf("%w: %w", errInDoubt, err)
	}
	return msgs, nil
}

// drain resolves the transactions in doubt, then waits until every
// source's forwarder group has every message behind its cursors.
func (r *sourcesRun) drain(timeout time.Duration) {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for name, s := range r.shards {
		var txs []string
		for {
			rows, err := s.pool.Query(ctx, `SELECT tx FROM `+schema+`.chaos_txs`)
			if err == nil {
				for rows.Next() {
					var tx string
					if err = rows.Scan(&tx); err != nil {
						break
					}
					txs = append(txs, tx)
				}
				rows.Close()
				if err == nil {
					err = rows.Err()
				}
			}
			if err == nil {
				break
			}
			if !sleep(ctx, 500*time.Millisecond) {
				t.Fatalf("%s: read the committed transactions: %v", name, err)
			}
		}
		committed := map[string]bool{}
		for _, tx := range txs {
			committed[tx] = true
		}
		r.mu.Lock()
		for i := range r.msgs {
			m := &r.msgs[i]
			switch {
			case m.Source != name:
			case m.Status == InDoubt && committed[m.Tx]:
				m.Status = Committed
			case m.Status == InDoubt:
				m.Status = RolledBack
			case m.Status == Committed && !committed[m.Tx]:
				t.Errorf("%s lost the acknowledged commit of %s", name, m.Tx)
			case m.Status == RolledBack && committed[m.Tx]:
				t.Errorf("%s: transaction %s committed though it failed or was rolled back", name, m.Tx)
			}
		}
		r.mu.Unlock()
	}
	start := time.Now()
	for {
		behind, err := r.behind(ctx)
		if err == nil && len(behind) == 0 {
			t.Logf("drained in %v", time.Since(start).Round(100*time.Millisecond))
			return
		}
		if !sleep(ctx, 250*time.Millisecond) {
			t.Fatalf("not drained %v after the storm: behind %v (err %v)", timeout, behind, err)
		}
	}
}

// behind lists the sources whose forwarder group has messages left.
func (r *sourcesRun) behind(ctx context.Context) ([]string, error) {
	var out []string
	for name, s := range r.shards {
		var left int64
		err := s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+schema+`.pending)
			+ (SELECT coalesce(sum(p.last_seq - coalesce(c.seq, 0)), 0) FROM `+schema+`.partitions p
			   LEFT JOIN `+schema+`.cursors c ON c.group_name = $1 AND c.topic = p.topic AND c.partition = p.partition)`, sourcesGroup).Scan(&left)
		if err != nil {
			return nil, err
		}
		if left > 0 {
			out = append(out, fmt.Sprintf("%s: %d", name, left))
		}
	}
	sort.Strings(out)
	return out, nil
}

// verify reads the Kafka topic back and checks it against what committed.
func (r *sourcesRun) verify() {
	t := r.t
	want := map[string]sourceMessage{} // by source/uuid
	lastN := map[string]int{}          // by source/key: the committed count
	rolledBack := map[string]bool{}
	for _, m := range r.msgs {
		id := m.Source + "/" + m.UUID
		if m.Status == Committed {
			want[id] = m
			lastN[m.Source+"/"+m.Key] = max(lastN[m.Source+"/"+m.Key], m.N)
		} else {
			rolledBack[id] = true
		}
	}
	seen := map[string]bool{}     // source/uuid
	seenID := map[string]string{} // source|outbox_id → uuid
	next := map[string]int{}      // source/key → the n expected next
	var faults []string
	fault := func(format string, args ...any) {
		if len(faults) < 20 {
			faults = append(faults, fmt.Sprintf(format, args...))
		}
	}
	records := r.kafka.ReadCommitted(t, r.topic)
	bySource := map[string]int{}
	for _, rec := range records {
		var p sourcePayload
		if err := json.Unmarshal(rec.Value, &p); err != nil {
			fault("record at %d/%d: unreadable payload: %v", rec.Partition, rec.Offset, err)
			continue
		}
		src, oid := kafkatest.Header(rec, outbox.MetadataSource), kafkatest.Header(rec, outbox.MetadataID)
		id := p.Source + "/" + p.ID
		switch {
		case src != p.Source:
			fault("misattributed: %s committed in %s arrived with outbox_source %q", p.ID, p.Source, src)
		case rolledBack[id]:
			fault("phantom: %s (rolled back) in Kafka", id)
		case want[id].UUID == "":
			fault("unknown: %s in Kafka", id)
		case seen[id]:
			fault("duplicate: %s twice in Kafka", id)
		}
		if prev, ok := seenID[src+"|"+oid]; ok && prev != p.ID {
			fault("one outbox id of %s, %s, carries two messages: %s and %s", src, oid, prev, p.ID)
		}
		seenID[src+"|"+oid] = p.ID
		seen[id] = true
		bySource[src]++
		key := p.Source + "/" + p.Key
		if next[key] == 0 {
			next[key] = 1
		}
		if p.N != next[key] {
			fault("reordered: %s message %d arrived where %d was next", key, p.N, next[key])
		}
		next[key] = p.N + 1
	}
	lost := 0
	for id := range want {
		if !seen[id] {
			lost++
			if lost <= 5 {
				fault("lost: %s committed and not in Kafka", id)
			}
		}
	}
	for key, n := range lastN {
		if next[key]-1 != n && lost == 0 {
			fault("key %s: %d committed, Kafka ends at %d", key, n, next[key]-1)
		}
	}
	t.Logf("Kafka holds %d records (%v) of %d committed messages; %d lost; storm: %d SIGKILLs, %d freezes, %d server crash",
		len(records), bySource, len(want), lost, r.kills.Load(), r.freezes.Load(), r.restarts.Load())
	if len(faults) > 0 {
		t.Errorf("faults (seed %d):\n%s", r.seed, strings.Join(faults, "\n"))
	}
	for _, name := range sourceNames {
		if bySource[name] == 0 {
			t.Errorf("nothing of %s in Kafka", name)
		}
	}
	if r.kills.Load() < 5 || r.freezes.Load() < 2 || r.restarts.Load() != 1 {
		t.Errorf("the storm was too weak to prove anything: %d SIGKILLs (want 5+), %d freezes (want 2+), %d server crashes (want 1)",
			r.kills.Load(), r.freezes.Load(), r.restarts.Load())
	}
}
