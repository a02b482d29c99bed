package admin_test

import (
	"strconv"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's outbox (see internal/outboxtest) with an Admin on it.
type env struct {
	*outboxtest.Bundle
	admin *admin.Admin
}

func newEnv(t *testing.T) env {
	t.Helper()
	b := outboxtest.Setup(t, outboxtest.NoLeaks())
	a, err := admin.New(admin.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return env{Bundle: b, admin: a}
}

// subscriber is a Subscriber of group without a sequencer of its own (the
// tests sequence explicitly), closed when the test ends.
func (e env) subscriber(t *testing.T, group string) *outbox.Subscriber {
	t.Helper()
	return e.Subscriber(group, func(c *outbox.SubscriberConfig) { c.DisableSequencer = true })
}

// delivery is one message as a handler saw it.
type delivery struct {
	partition int
	seq       int64
	uuid      string
}

// recorder collects deliveries; by default it acks each one.
type recorder struct {
	mu   sync.Mutex
	all  []delivery
	hold func(d delivery) bool // when true, the message is handed to held instead of acked
	held chan *message.Message
}

func (r *recorder) run(msgs <-chan *message.Message) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for m := range msgs {
			p, _ := strconv.Atoi(m.Metadata.Get(outbox.MetadataPartition))
			s, _ := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSeq), 10, 64)
			d := delivery{partition: p, seq: s, uuid: m.UUID}
			r.mu.Lock()
			r.all = append(r.all, d)
			hold := r.hold != nil && r.hold(d)
			r.mu.Unlock()
			if hold {
				r.held <- m
				continue
			}
			m.Ack()
		}
	}()
	return &wg
}

// seqs returns the seqs delivered from partition, in delivery order, from
// delivery number from on.
func (r *recorder) seqs(partition, from int) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int64
	for i, d := range r.all {
		if i >= from && d.partition == partition {
			out = append(out, d.seq)
		}
	}
	return out
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.all)
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}
