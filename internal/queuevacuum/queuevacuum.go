// Package queuevacuum keeps the pending table compact whatever the rate.
//
// pending is a queue: a publisher inserts every message and the sequencer
// deletes it milliseconds later. The deleted rows stay in the table and its
// primary key until a vacuum, and every sequencer pass steps over them: its
// statements read pending from the left edge of the primary key, where they
// pile up. Autovacuum visits a database at most every autovacuum_naptime
// (1 min by default): at 1,000 msg/s that is up to 60,000 dead rows, at
// 10,000 msg/s 600,000, and the table's size and the passes' cost grow with
// the rate. So a sequencer vacuums pending itself once it has moved Every
// rows out of it since its last vacuum (at most once per MinGap): the table
// then holds about Every dead rows at most, at any rate. A vacuum of a table
// that small takes milliseconds and runs beside the passes, not in them.
//
// The same VACUUM takes the two small tables updated all the time,
// partitions and cursors (dbsql's PendingVacuum says why their HOT updates
// still need it). VACUUM needs the tables' owner (or a superuser); a
// sequencer whose role is neither says so once and leaves them to
// autovacuum.
package queuevacuum

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/dbsql"
)

// Defaults: a vacuum every Every rows moved, at most one per MinGap.
const (
	Every  = 10_000
	MinGap = time.Second
)

// Vacuumer vacuums one schema's pending table (with partitions and
// cursors) for one sequencer. Moved is called by one goroutine (the
// sequencer's loop); Wait waits for the vacuum in flight.
type Vacuumer struct {
	pool   *pgxpool.Pool
	schema string
	q      *dbsql.Queries
	logger watermill.LoggerAdapter
	every  int64
	minGap time.Duration

	mu       sync.Mutex
	moved    int64     // rows moved since the last vacuum started
	last     time.Time // when the last vacuum started
	running  bool
	allowed  int8 // 0: not asked yet, 1: may vacuum, -1: may not
	inFlight sync.WaitGroup

	vacuums atomic.Int64
}

// New returns a Vacuumer of schema's pending table through pool, with the
// defaults Every and MinGap.
func New(pool *pgxpool.Pool, schema string, logger watermill.LoggerAdapter) *Vacuumer {
	return NewWith(pool, schema, logger, Every, MinGap)
}

// NewWith is New with another pace (for tests).
func NewWith(pool *pgxpool.Pool, schema string, logger watermill.LoggerAdapter, every int64, minGap time.Duration) *Vacuumer {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Vacuumer{pool: pool, schema: schema, q: dbsql.For(schema), logger: logger, every: every, minGap: minGap}
}

// Vacuums is how many vacuums of pending finished.
func (v *Vacuumer) Vacuums() int64 { return v.vacuums.Load() }

// Moved tells the Vacuumer that n more rows left pending, and starts a
// vacuum in the background when one is due and none is running. The vacuum
// ends with ctx.
func (v *Vacuumer) Moved(ctx context.Context, n int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.moved += int64(n)
	if v.allowed < 0 || v.running || v.moved < v.every || time.Since(v.last) < v.minGap {
		return
	}
	v.running, v.moved, v.last = true, 0, time.Now()
	v.inFlight.Add(1)
	go func() {
		defer v.inFlight.Done()
		v.vacuum(ctx)
		v.mu.Lock()
		v.running = false
		v.mu.Unlock()
	}()
}

// Wait waits until the vacuum in flight, if any, has returned.
func (v *Vacuumer) Wait() { v.inFlight.Wait() }

func (v *Vacuumer) vacuum(ctx context.Context) {
	v.mu.Lock()
	allowed := v.allowed
	v.mu.Unlock()
	if allowed == 0 {
		var ok bool
		if err := v.pool.QueryRow(ctx, v.q.PendingCanVacuum, v.schema).Scan(&ok); err != nil {
			if ctx.Err() == nil {
				v.logger.Debug("Could not tell whether the sequencer may vacuum pending; asking again later", watermill.LogFields{"err": err.Error()})
			}
			return
		}
		allowed = 1
		if !ok {
			allowed = -1
			v.logger.Info("The sequencer's role does not own the pending table, so it leaves its vacuuming to autovacuum; "+
				"see docs/postgresql.md, The tables that churn", nil)
		}
		v.mu.Lock()
		v.allowed = allowed
		v.mu.Unlock()
	}
	if allowed < 0 {
		return
	}
	started := time.Now()
	if _, err := v.pool.Exec(ctx, v.q.PendingVacuum); err != nil {
		if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			v.logger.Error("Vacuuming pending failed; autovacuum will, and the sequencer tries again", err, nil)
		}
		return
	}
	v.vacuums.Add(1)
	v.logger.Trace("Vacuumed pending", watermill.LogFields{"took": time.Since(started)})
}
