package forwarder

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/forward"
	"github.com/millrace/watermill-outbox/internal/origin"
)

// ErrNotSent is the result the middleware chain of a message sees when the
// message was not sent because one before it in its batch failed (in the
// target or in middleware): the forwarder retries it later, in order.
var ErrNotSent = errors.New("forwarder: not sent: an earlier message of its batch failed; it is retried in order")

// sendThrough runs every message of batch through the configured middleware
// chain, as a Watermill router runs a handler: the innermost handler is
// "forward this message", and each chain sees that message's real outcome
// and duration. The batch is still sent in one Send, and the chains still
// run in seq order, one message after the other, in both halves:
//
//   - Each chain runs on its own goroutine, started once the previous
//     message reached the innermost handler (or ended its chain without
//     reaching it). The innermost call registers the message and waits.
//   - When every message is there, the messages that reached the innermost
//     handler are sent in one Send, up to the first whose chain failed
//     before reaching it.
//   - The innermost calls then return one after the other, each once the
//     previous message's chain has returned: nil if its message was
//     confirmed, the target's error for the first unconfirmed one, and
//     ErrNotSent for those behind it.
//
// A second innermost call for the same message (e.g. a Retry middleware)
// sends that message alone, once every message before it in the batch is
// done, and is refused with ErrNotSent if one of them failed: a retry can
// never overtake the order of its key.
//
// The batch's outcome follows the chains' returns, as a router acks on nil:
// done is the number of leading messages whose chain returned nil.
func (f *Forwarder) sendThrough(ctx context.Context, from origin.Origin, targetTopic string, batch []*message.Message) (int, error) {
	b := &middlewareBatch{
		f:       f,
		ctx:     ctx,
		from:    from,
		topic:   targetTopic,
		msgs:    make([]*message.Message, len(batch)),
		reached: make([]bool, len(batch)),
		ended:   make([]bool, len(batch)),
		results: make([]error, len(batch)),
		chained: make([]error, len(batch)),
		sent:    make(chan struct{}),
	}
	b.cond = sync.NewCond(&b.mu)
	stop := context.AfterFunc(ctx, b.wake)
	defer stop()
	var wg sync.WaitGroup
	for i, msg := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := b.runChain(i, msg)
			b.mu.Lock()
			b.ended[i], b.chained[i] = true, err
			b.cond.Broadcast()
			b.mu.Unlock()
		}()
		// The next chain starts once this message is at the innermost
		// handler, or done with its chain.
		b.mu.Lock()
		for !b.reached[i] && !b.ended[i] && ctx.Err() == nil {
			b.cond.Wait()
		}
		b.mu.Unlock()
	}
	b.sendWhenReady()
	wg.Wait()
	for i, err := range b.chained {
		if err != nil {
			return i, err
		}
	}
	return len(batch), nil
}

type middlewareBatch struct {
	f     *Forwarder
	ctx   context.Context
	from  origin.Origin // where the batch comes from, for the target
	topic string

	mu      sync.Mutex
	cond    *sync.Cond
	msgs    []*message.Message // as each reached the innermost handler
	reached []bool             // the innermost handler was called
	ended   []bool             // the chain returned
	results []error            // the innermost result, once sent
	chained []error            // what each chain returned
	sent    chan struct{}      // closed once the batch was sent
}

// runChain runs message i's chain, turning a panic into an error.
func (b *middlewareBatch) runChain(i int, msg *message.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("forwarder: panic in handler middleware: %v\n%s", r, debug.Stack())
		}
	}()
	h := b.innermost(i)
	for j := len(b.f.cfg.Middlewares) - 1; j >= 0; j-- {
		h = b.f.cfg.Middlewares[j](h)
	}
	_, err = h(msg) // produced messages are not published: see Config.Middlewares
	return err
}

// innermost is message i's "forward this message" handler.
func (b *middlewareBatch) innermost(i int) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		b.mu.Lock()
		if !b.reached[i] {
			b.reached[i], b.msgs[i] = true, msg
			b.cond.Broadcast()
			b.mu.Unlock()
			select {
			case <-b.sent:
			case <-b.ctx.Done():
				return nil, b.ctx.Err()
			}
			// Answer in order: after the previous message's chain.
			b.mu.Lock()
			defer b.mu.Unlock()
			for i > 0 && !b.ended[i-1] && b.ctx.Err() == nil {
				b.cond.Wait()
			}
			return nil, b.results[i]
		}
		b.mu.Unlock()
		return nil, b.again(i, msg)
	}
}

// sendWhenReady waits until every message reached the innermost handler or
// ended its chain (or ctx ends), sends the prefix that reached it, and
// publishes the results.
func (b *middlewareBatch) sendWhenReady() {
	b.mu.Lock()
	for !b.settled() && b.ctx.Err() == nil {
		b.cond.Wait()
	}
	// The messages to send, in order: those that reached the innermost
	// handler, up to the first whose chain failed without reaching it. A
	// chain that returned nil without reaching it dropped its message (a
	// filter): it is done, and skipped.
	var prefix []*message.Message
	var index []int // index[k]: the batch position of prefix[k]
	for i := range b.msgs {
		if b.reached[i] {
			prefix, index = append(prefix, b.msgs[i]), append(index, i)
			continue
		}
		if b.ended[i] && b.chained[i] == nil {
			continue
		}
		break
	}
	n := len(prefix)
	b.mu.Unlock()

	done, err := 0, error(nil)
	if n > 0 {
		done, err = forward.Direct(b.f.cfg.Target)(b.ctx, b.from, b.topic, prefix)
		done = max(0, min(done, n))
		if done < n && err == nil {
			err = fmt.Errorf("forwarder: target confirmed %d of %d messages without an error", done, n)
		}
	}
	b.mu.Lock()
	for i := range b.results {
		b.results[i] = ErrNotSent
	}
	for k, i := range index {
		switch {
		case k < done:
			b.results[i] = nil
		case k == done:
			b.results[i] = forward.BrokerWide(err)
		}
	}
	b.mu.Unlock()
	close(b.sent)
}

// wake lets every waiter see that the batch's context ended.
func (b *middlewareBatch) wake() {
	b.mu.Lock()
	b.cond.Broadcast()
	b.mu.Unlock()
}

func (b *middlewareBatch) settled() bool {
	for i := range b.msgs {
		if !b.reached[i] && !b.ended[i] {
			return false
		}
	}
	return true
}

// again handles a second innermost call for message i: it sends the message
// alone once every message before it has ended its chain without error.
func (b *middlewareBatch) again(i int, msg *message.Message) error {
	<-b.sent
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		ready := true
		for j := 0; j < i; j++ {
			if !b.ended[j] {
				ready = false
				break
			}
			if b.chained[j] != nil {
				return ErrNotSent
			}
		}
		if ready {
			break
		}
		if b.ctx.Err() != nil {
			return b.ctx.Err()
		}
		b.cond.Wait()
	}
	b.mu.Unlock()
	done, err := b.f.cfg.Target.Send(b.ctx, b.topic, []*message.Message{msg})
	b.mu.Lock()
	if done >= 1 {
		return nil
	}
	if err == nil {
		err = errors.New("forwarder: target did not confirm the message, without an error")
	}
	return forward.BrokerWide(err)
}
