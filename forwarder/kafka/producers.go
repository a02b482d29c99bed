package kafka

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
)

// At least once, a Target sends each outbox partition's batches through a
// producer (a kgo client) of that partition's own (at_least_once.go says
// why). The clients are made on a partition's first Send and closed after
// Config.ProducerIdleTimeout without one. (Exactly once, one transactional
// producer sends for every partition: exactly_once.go.)

// producer is the kgo client of one outbox partition at least once,
// idempotent and flushed by hand. Sends of one outbox partition never
// overlap (the partition's lease), and mu serializes them anyway.
type producer struct {
	id     string
	mu     sync.Mutex
	client atomic.Pointer[producerClient] // read without mu by Close

	// Under mu.
	retired  bool // out of the target's map: get another
	lastUsed time.Time
}

// producerClient is a producer's driver client: transactional (exactly
// once) or idempotent (at least once).
type producerClient struct {
	txn  kafkadriver.Transactional
	idem kafkadriver.Idempotent
}

func (c *producerClient) close() {
	if c.txn != nil {
		c.txn.Close()
	}
	if c.idem != nil {
		c.idem.Close()
	}
}

// retire closes the producer's client; mu is held.
func (p *producer) retire() {
	p.retired = true
	if cl := p.client.Swap(nil); cl != nil {
		cl.close()
	}
}

// drop forgets the producer's client after a failure that leaves it in
// doubt (closed in the background: closing waits for nothing the send
// needs); the next Send starts on a new one. mu is held.
func (t *Target) drop(p *producer) {
	if cl := p.client.Swap(nil); cl != nil {
		t.closeLater(cl)
	}
}

// withProducer runs fn holding the producer of id (created when missing):
// one send at a time on it, none while the idle sweep retires it.
func (t *Target) withProducer(id string, fn func(p *producer) error) error {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return outbox.ErrClosed
		}
		p := t.producers[id]
		if p == nil {
			p = &producer{id: id}
			t.producers[id] = p
		}
		t.mu.Unlock()
		if ok, err := p.use(fn); ok {
			return err
		}
		// Retired by the idle sweep meanwhile: take a new one.
	}
}

// use runs fn holding p, unless p was retired (ok false).
func (p *producer) use(fn func(p *producer) error) (ok bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.retired {
		return false, nil
	}
	p.lastUsed = time.Now()
	return true, fn(p)
}

// sweepIdle closes the producers that sent nothing for
// ProducerIdleTimeout, until ctx ends (Close).
func (t *Target) sweepIdle(ctx context.Context) {
	every := max(time.Second, t.cfg.ProducerIdleTimeout/4)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		var idle []*producer
		for id, p := range t.producers {
			if !p.mu.TryLock() {
				continue // sending
			}
			if time.Since(p.lastUsed) >= t.cfg.ProducerIdleTimeout {
				delete(t.producers, id)
				p.retired = true
				idle = append(idle, p)
			} else {
				p.mu.Unlock()
			}
		}
		t.mu.Unlock()
		for _, p := range idle {
			t.logger.Debug("Closing an idle partition producer", watermill.LogFields{"producer": p.id})
			p.retire()
			p.mu.Unlock()
		}
	}
}

// OpenProducers is the number of producers (kgo clients) the target holds
// open: exactly once, its one transactional producer once it started; at
// least once, one per outbox partition sent for within
// Config.ProducerIdleTimeout.
func (t *Target) OpenProducers() int {
	if t == nil || t.txn == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.producers)
	if t.txn.client.Load() != nil {
		n++
	}
	return n
}
