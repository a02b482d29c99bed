package forwarder_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's outbox (see internal/outboxtest) with a dead-letter
// table its RejectHandler writes to.
type env struct{ *outboxtest.Bundle }

func newEnv(t *testing.T) env {
	t.Helper()
	e := env{outboxtest.Setup(t)}
	e.Exec(`CREATE TABLE ` + e.Schema + `.test_dead_letters (id text PRIMARY KEY, uuid text NOT NULL, reason text NOT NULL)`)
	return e
}

// deadLetters is the RejectHandler of the tests: one row per rejected
// message, written in the transaction that moves the cursor past it.
func (e env) deadLetters() outbox.RejectHandler {
	return outbox.RejectHandlerFunc(func(ctx context.Context, tx pgx.Tx, m outbox.RejectedMessage) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+e.Schema+`.test_dead_letters (id, uuid, reason) VALUES ($1, $2, $3)`,
			outbox.StableID(m.Topic, m.Partition, m.Seq), m.UUID, fmt.Sprint(m.Reason))
		return err
	})
}

// deadLettered returns uuid -> reason of the rejected messages.
func (e env) deadLettered(t *testing.T) map[string]string {
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

// published describes a message the test published to the outbox.
type published struct {
	key string
	n   int // counts per key from 1
}

// publisher publishes keyed messages with metadata "n" counting per key.
type publisher struct {
	t    *testing.T
	e    env
	pub  *outbox.Publisher
	mu   sync.Mutex
	all  map[string]published // by uuid
	next map[string]int       // key -> last n
}

func newPublisher(t *testing.T, e env) *publisher {
	t.Helper()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &publisher{t: t, e: e, pub: pub, all: map[string]published{}, next: map[string]int{}}
}

// round publishes one message for each of keys keys in one transaction;
// payloadSize pads the payload. edit, when set, may change each message.
func (p *publisher) round(topic string, keys int, edit func(*message.Message)) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var batch []*message.Message
	var infos []published
	for k := 0; k < keys; k++ {
		key := "key-" + strconv.Itoa(k)
		n := p.next[key] + 1
		m := message.NewMessage(watermill.NewUUID(), []byte(key+"/"+strconv.Itoa(n)))
		m.Metadata.Set(outbox.PartitionKeyMetadata, key)
		m.Metadata.Set("n", strconv.Itoa(n))
		if edit != nil {
			edit(m)
		}
		batch = append(batch, m)
		infos = append(infos, published{key, n})
	}
	if err := p.pub.Publish(topic, batch...); err != nil {
		p.t.Error(err)
		return
	}
	for i, m := range batch {
		p.all[m.UUID] = infos[i]
		p.next[infos[i].key] = infos[i].n
	}
}

func (p *publisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.all)
}

func (p *publisher) snapshot() map[string]published {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]published, len(p.all))
	for k, v := range p.all {
		out[k] = v
	}
	return out
}

// received records what a broker's consumer got, in arrival order.
type received struct {
	mu    sync.Mutex
	msgs  []got
	ids   map[string]string // outbox id -> uuid
	uuids map[string]bool
}

type got struct {
	uuid, id, key string
	n             int
	// brokerPartition is the Kafka partition (-1 for NATS).
	brokerPartition int
	outboxPartition int
	metadata        message.Metadata
}

func (r *received) add(m *message.Message, brokerPartition int) {
	n, _ := strconv.Atoi(m.Metadata.Get("n"))
	op, _ := strconv.Atoi(m.Metadata.Get(outbox.MetadataPartition))
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids, r.uuids = map[string]string{}, map[string]bool{}
	}
	r.msgs = append(r.msgs, got{
		uuid: m.UUID, id: m.Metadata.Get(outbox.MetadataID), key: m.Metadata.Get(outbox.PartitionKeyMetadata), n: n,
		brokerPartition: brokerPartition, outboxPartition: op, metadata: m.Metadata,
	})
	r.uuids[m.UUID] = true
}

func (r *received) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.uuids)
}

// check verifies what arrived against what was published (minus the
// rejected uuids): every message arrived; per key, first arrivals follow
// publish order; every message carries its stable id, and every copy of an
// id is the same message. It returns the number of duplicates.
func (r *received) check(t *testing.T, want map[string]published, rejected map[string]string) (duplicates int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	idOf := map[string]string{} // uuid -> id
	uuidOf := map[string]string{}
	lastN := map[string]int{}
	for _, g := range r.msgs {
		if g.id == "" {
			t.Fatalf("message %s arrived without %s", g.uuid, outbox.MetadataID)
		}
		if _, ok := want[g.uuid]; !ok {
			t.Fatalf("message %s arrived but was never published (or was rejected)", g.uuid)
		}
		if rejected[g.uuid] != "" {
			t.Fatalf("rejected message %s arrived", g.uuid)
		}
		if u, seen := uuidOf[g.id]; seen {
			if u != g.uuid {
				t.Fatalf("id %s carried by %s and %s", g.id, u, g.uuid)
			}
			duplicates++
			continue
		}
		if id, seen := idOf[g.uuid]; seen && id != g.id {
			t.Fatalf("message %s arrived with ids %s and %s", g.uuid, id, g.id)
		}
		uuidOf[g.id], idOf[g.uuid] = g.uuid, g.id
		p := want[g.uuid]
		if g.key != p.key || g.n != p.n {
			t.Fatalf("message %s arrived as %s/%d, published as %s/%d", g.uuid, g.key, g.n, p.key, p.n)
		}
		// Rejected messages leave gaps: skip the ns that were rejected.
		expect := lastN[p.key] + 1
		for rejectedN(want, rejected, p.key, expect) {
			expect++
		}
		if p.n != expect {
			t.Fatalf("key %s: n=%d arrived after n=%d (first arrivals out of order)", p.key, p.n, lastN[p.key])
		}
		lastN[p.key] = p.n
	}
	for u := range want {
		if rejected[u] == "" && idOf[u] == "" {
			t.Fatalf("message %s (%v) never arrived", u, want[u])
		}
	}
	return duplicates
}

func rejectedN(want map[string]published, rejected map[string]string, key string, n int) bool {
	for u := range rejected {
		if p, ok := want[u]; ok && p.key == key && p.n == n {
			return true
		}
	}
	return false
}

// startForwarder runs a forwarder until the test ends.
func startForwarder(t *testing.T, e env, pool *pgxpool.Pool, target forwarder.Target, topics []string, tune func(*forwarder.Config)) *forwarder.Forwarder {
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
			RejectHandler: e.deadLetters(),
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
