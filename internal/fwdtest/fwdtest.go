// Package fwdtest holds the outbox side of the forwarder tests, shared by
// the tests of every target (Kafka, JetStream, any Watermill publisher): an
// outbox with a dead-letter table (Env), a publisher of keyed messages that
// remembers what it published (Publisher), a record of what a broker's
// consumer received with the checks every target must pass (Received), a
// running forwarder (StartForwarder), an instance that dies in the middle
// of a batch (CrashingTarget), and batches as the Subscriber delivers them
// (OutboxBatch).
//
// A test package that uses it runs its tests against the throwaway
// PostgreSQL of internal/pgtest: its TestMain calls pgtest.Main(m).
package fwdtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Env is one test's outbox (see internal/outboxtest) with a dead-letter
// table its RejectHandler (DeadLetters) writes to.
type Env struct{ *outboxtest.Bundle }

// NewEnv sets up an outbox schema of the test's own with a dead-letter
// table.
func NewEnv(t *testing.T) Env {
	t.Helper()
	return EnvOf(outboxtest.Setup(t))
}

// EnvOf is the Env of a bundle set up elsewhere (a cluster of the test's
// own, say), with its dead-letter table created.
func EnvOf(b *outboxtest.Bundle) Env {
	e := Env{b}
	e.Exec(`CREATE TABLE ` + e.Schema + `.test_dead_letters (id text PRIMARY KEY, uuid text NOT NULL, reason text NOT NULL)`)
	return e
}

// DeadLetters is the RejectHandler of the tests: one row per rejected
// message, written in the transaction that moves the cursor past it.
func (e Env) DeadLetters() outboxtype.RejectHandler {
	return outboxtype.RejectHandlerFunc(func(ctx context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+e.Schema+`.test_dead_letters (id, uuid, reason) VALUES ($1, $2, $3)`,
			outbox.StableID(m.Topic, m.Partition, m.Seq), m.UUID, fmt.Sprint(m.Reason))
		return err
	})
}

// DeadLettered returns uuid -> reason of the rejected messages.
func (e Env) DeadLettered(t *testing.T) map[string]string {
	t.Helper()
	rows, err := e.Pool.Query(outboxtest.Ctx(t), `SELECT uuid, reason FROM `+e.Schema+`.test_dead_letters`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var u, r string
		if err := rows.Scan(&u, &r); err != nil {
			t.Fatal(err)
		}
		out[u] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Published describes a message the test published to the outbox.
type Published struct {
	Key string
	N   int // counts per key from 1
}

// Publisher publishes keyed messages with metadata "n" counting per key,
// and remembers them by UUID.
type Publisher struct {
	t    *testing.T
	pub  *outbox.Publisher
	mu   sync.Mutex
	all  map[string]Published // by uuid
	next map[string]int       // key -> last n
}

// NewPublisher returns a Publisher into e's outbox.
func NewPublisher(t *testing.T, e Env) *Publisher {
	t.Helper()
	return NewPublisherMode(t, e, outbox.ModeTable)
}

// NewPublisherMode returns a Publisher into e's outbox that publishes in
// mode.
func NewPublisherMode(t *testing.T, e Env, mode outbox.PublishMode) *Publisher {
	t.Helper()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true, Mode: mode}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &Publisher{t: t, pub: pub, all: map[string]Published{}, next: map[string]int{}}
}

// Round publishes one message for each of keys keys ("key-0" …) in one
// transaction. edit, when set, may change each message.
func (p *Publisher) Round(topic string, keys int, edit func(*message.Message)) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var batch []*message.Message
	var infos []Published
	for k := 0; k < keys; k++ {
		key := "key-" + strconv.Itoa(k)
		n := p.next[key] + 1
		m := message.NewMessage(watermill.NewUUID(), []byte(key+"/"+strconv.Itoa(n)))
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
		m.Metadata.Set("n", strconv.Itoa(n))
		if edit != nil {
			edit(m)
		}
		batch = append(batch, m)
		infos = append(infos, Published{key, n})
	}
	if err := p.pub.Publish(topic, batch...); err != nil {
		p.t.Error(err)
		return
	}
	for i, m := range batch {
		p.all[m.UUID] = infos[i]
		p.next[infos[i].Key] = infos[i].N
	}
}

// Keep publishes a Round of keys messages to topic every interval until
// the returned stop is called; stop returns once the last Round is done.
func (p *Publisher) Keep(topic string, keys int, interval time.Duration) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case <-time.After(interval):
				p.Round(topic, keys, nil)
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// Count is the number of messages published.
func (p *Publisher) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.all)
}

// Snapshot returns uuid -> Published of every message published so far.
func (p *Publisher) Snapshot() map[string]Published {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]Published, len(p.all))
	for k, v := range p.all {
		out[k] = v
	}
	return out
}

// Received records what a broker's consumer got, in arrival order. The
// zero value is ready to use.
type Received struct {
	mu    sync.Mutex
	msgs  []Got
	uuids map[string]bool
}

// Got is one message a consumer received.
type Got struct {
	UUID, ID, Key string
	N             int
	// BrokerPartition is the Kafka partition (-1 for NATS).
	BrokerPartition int
	OutboxPartition int
	Metadata        message.Metadata
}

// Add records m, received from brokerPartition.
func (r *Received) Add(m *message.Message, brokerPartition int) {
	n, _ := strconv.Atoi(m.Metadata.Get("n"))
	op, _ := strconv.Atoi(m.Metadata.Get(outbox.MetadataPartition))
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.uuids == nil {
		r.uuids = map[string]bool{}
	}
	r.msgs = append(r.msgs, Got{
		UUID: m.UUID, ID: m.Metadata.Get(outbox.MetadataID), Key: m.Metadata.Get(outbox.PublishPartitionKeyMetadata), N: n,
		BrokerPartition: brokerPartition, OutboxPartition: op, Metadata: m.Metadata,
	})
	r.uuids[m.UUID] = true
}

// Distinct is the number of distinct UUIDs received.
func (r *Received) Distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.uuids)
}

// Total is the number of messages received, copies included.
func (r *Received) Total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// Messages returns what was received so far, in arrival order.
func (r *Received) Messages() []Got {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Got(nil), r.msgs...)
}

// Check verifies what arrived against what was published (minus the
// rejected uuids): every message arrived; per key, first arrivals follow
// publish order; every message carries its stable id, and every copy of an
// id is the same message. It returns the number of duplicates.
func (r *Received) Check(t *testing.T, want map[string]Published, rejected map[string]string) (duplicates int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	idOf := map[string]string{} // uuid -> id
	uuidOf := map[string]string{}
	lastN := map[string]int{}
	for _, g := range r.msgs {
		if g.ID == "" {
			t.Fatalf("message %s arrived without %s", g.UUID, outbox.MetadataID)
		}
		if _, ok := want[g.UUID]; !ok {
			t.Fatalf("message %s arrived but was never published (or was rejected)", g.UUID)
		}
		if rejected[g.UUID] != "" {
			t.Fatalf("rejected message %s arrived", g.UUID)
		}
		if u, seen := uuidOf[g.ID]; seen {
			if u != g.UUID {
				t.Fatalf("id %s carried by %s and %s", g.ID, u, g.UUID)
			}
			duplicates++
			continue
		}
		if id, seen := idOf[g.UUID]; seen && id != g.ID {
			t.Fatalf("message %s arrived with ids %s and %s", g.UUID, id, g.ID)
		}
		uuidOf[g.ID], idOf[g.UUID] = g.UUID, g.ID
		p := want[g.UUID]
		if g.Key != p.Key || g.N != p.N {
			t.Fatalf("message %s arrived as %s/%d, published as %s/%d", g.UUID, g.Key, g.N, p.Key, p.N)
		}
		// Rejected messages leave gaps: skip the ns that were rejected.
		expect := lastN[p.Key] + 1
		for rejectedN(want, rejected, p.Key, expect) {
			expect++
		}
		if p.N != expect {
			t.Fatalf("key %s: n=%d arrived after n=%d (first arrivals out of order)", p.Key, p.N, lastN[p.Key])
		}
		lastN[p.Key] = p.N
	}
	for u := range want {
		if rejected[u] == "" && idOf[u] == "" {
			t.Fatalf("message %s (%v) never arrived", u, want[u])
		}
	}
	return duplicates
}

func rejectedN(want map[string]Published, rejected map[string]string, key string, n int) bool {
	for u := range rejected {
		if p, ok := want[u]; ok && p.Key == key && p.N == n {
			return true
		}
	}
	return false
}

// StartForwarder runs a forwarder of e's topics to target until the test
// ends, with the fast tuning of internal/outboxtest and e's dead letters.
// pool, when set, replaces e's (e.g. a pgtest.FreezablePool); tune, when
// set, changes the config first.
func StartForwarder(t *testing.T, e Env, pool *pgxpool.Pool, target forwarder.Target, topics []string, tune func(*forwarder.Config)) *forwarder.Forwarder {
	t.Helper()
	if pool == nil {
		pool = e.Pool
	}
	cfg := forwarder.Config{
		Subscriber: outbox.SubscriberConfig{
			Schema:        e.Schema,
			Pool:          pool,
			Tuning:        outboxtest.FastTuning(),
			Advanced:      outboxtest.FastAdvanced(),
			RejectHandler: e.DeadLetters(),
			CloseTimeout:  time.Second,
		},
		Topics: topics,
		Target: target,
	}
	if tune != nil {
		tune(&cfg)
	}
	fwd, err := forwarder.NewForwarder(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fwd.Run(context.Background()) }()
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			_ = fwd.Close()
			if err := <-done; err != nil {
				t.Errorf("forwarder.Run: %v", err)
			}
		})
	})
	return fwd
}

// CrashingTarget passes batches to an inner target until, after a number
// of messages, it "crashes" in the middle of a batch: it sends the first
// half of that batch, freezes the instance's database pool (no more lease
// renewals) and blocks every send until Release is closed. Another instance
// must take over.
type CrashingTarget struct {
	inner  forwarder.Target
	after  int64
	freeze func()
	once   sync.Once

	// Sent counts the messages the inner target confirmed before the crash.
	Sent atomic.Int64
	// HalfLen is how many messages of the half batch the inner target
	// confirmed.
	HalfLen atomic.Int64
	// Crashed is closed at the crash.
	Crashed chan struct{}
	// Release, closed by the test, lets the blocked sends return
	// ErrCrashed.
	Release chan struct{}
}

// NewCrashingTarget returns a CrashingTarget that crashes in the first
// batch of at least 4 messages after inner confirmed after messages;
// freeze cuts the instance's database pool off.
func NewCrashingTarget(inner forwarder.Target, after int64, freeze func()) *CrashingTarget {
	return &CrashingTarget{inner: inner, after: after, freeze: freeze, Crashed: make(chan struct{}), Release: make(chan struct{})}
}

// ErrCrashed is what a CrashingTarget's sends return after the crash.
var ErrCrashed = errors.New("instance crashed")

// Send implements forwarder.Target.
func (c *CrashingTarget) Send(ctx context.Context, topic string, batch []*message.Message) (int, error) {
	select {
	case <-c.Crashed:
		<-c.Release
		return 0, ErrCrashed
	default:
	}
	if c.Sent.Load() >= c.after && len(batch) >= 4 {
		crashNow := false
		c.once.Do(func() { crashNow = true })
		if crashNow {
			half := batch[:len(batch)/2]
			if done, err := c.inner.Send(ctx, topic, half); err == nil {
				c.HalfLen.Store(int64(done))
			}
			c.freeze()
			close(c.Crashed)
			<-c.Release
			return 0, ErrCrashed
		}
		<-c.Release
		return 0, ErrCrashed
	}
	done, err := c.inner.Send(ctx, topic, batch)
	c.Sent.Add(int64(done))
	return done, err
}

// OutboxBatch returns n messages as the Subscriber would deliver them from
// partition 0 of topic "orders": n consecutive seqs, stable ids, partition
// keys from key(i), metadata "i" = i (the position in the batch).
//
// Each call continues the seqs of the last, as the Subscriber's next batch
// would: an exactly-once target skips what it already wrote by seq.
func OutboxBatch(n int, key func(i int) string) []*message.Message {
	batch := make([]*message.Message, n)
	for i := range batch {
		seq := lastBatchSeq.Add(1)
		m := message.NewMessage(watermill.NewUUID(), []byte("payload "+strconv.Itoa(i)))
		m.Metadata.Set(outbox.MetadataID, outbox.StableID("orders", 0, seq))
		m.Metadata.Set(outbox.MetadataTopic, "orders")
		m.Metadata.Set(outbox.MetadataPartition, "0")
		m.Metadata.Set(outbox.MetadataSeq, strconv.FormatInt(seq, 10))
		m.Metadata.Set(outbox.MetadataPartitionKey, key(i))
		m.Metadata.Set("i", strconv.Itoa(i))
		batch[i] = m
	}
	return batch
}

var lastBatchSeq atomic.Int64

// SameKey is the key function of a batch whose messages share one key.
func SameKey(int) string { return "key" }

// UpTo returns from, from+1, … to-1, without except.
func UpTo(from, to int, except ...int) []int {
	var out []int
next:
	for i := from; i < to; i++ {
		for _, e := range except {
			if i == e {
				continue next
			}
		}
		out = append(out, i)
	}
	return out
}

// AssertPositions fails the test unless got equals want.
func AssertPositions(t *testing.T, what string, got, want []int) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
}

// AttemptLog wraps a RejectHandler to record the attempts of each rejected
// message. The zero value is ready to use.
type AttemptLog struct {
	mu sync.Mutex
	n  map[string]int
}

// Wrap returns h, recording the attempts of each message it gets.
func (a *AttemptLog) Wrap(h outboxtype.RejectHandler) outboxtype.RejectHandler {
	return outboxtype.RejectHandlerFunc(func(ctx context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
		a.mu.Lock()
		if a.n == nil {
			a.n = map[string]int{}
		}
		a.n[m.UUID] = m.Attempts
		a.mu.Unlock()
		return h.HandleReject(ctx, tx, m)
	})
}

// Of returns the attempts of the rejected message uuid (0: not rejected).
func (a *AttemptLog) Of(uuid string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[uuid]
}
