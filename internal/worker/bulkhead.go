package worker

import (
	"context"
	"fmt"
	"sync"

	"github.com/millrace/watermill-outbox/internal/tune"
)

// Bulkhead limits how many workers execute at the same time. Share one
// Bulkhead between all workers that hit the same resource. It is safe for
// concurrent use.
type Bulkhead struct {
	slots chan struct{}
}

// NewBulkhead returns a Bulkhead admitting at most limit concurrent
// executions, or a [*tune.ConfigError] if limit < 1.
func NewBulkhead(limit int) (*Bulkhead, error) {
	if limit < 1 {
		return nil, &tune.ConfigError{Field: "Bulkhead limit", Reason: fmt.Sprintf("must be >= 1, got %d", limit)}
	}
	return &Bulkhead{slots: make(chan struct{}, limit)}, nil
}

// Acquire waits for a free slot and returns a function that frees it again.
// Calling release more than once has no further effect. If ctx is done
// before a slot frees up (or already), Acquire returns ctx.Err() and holds
// nothing.
func (b *Bulkhead) Acquire(ctx context.Context) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case b.slots <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-b.slots }) }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Limit returns the maximum number of concurrent executions.
func (b *Bulkhead) Limit() int { return cap(b.slots) }

// InUse returns how many slots are currently held.
func (b *Bulkhead) InUse() int { return len(b.slots) }
