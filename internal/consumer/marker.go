package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/dbsql"
)

// Marker records, for the workers of one Subscriber, each message after the
// head of a batch delivered one at a time as its partition's delivery in
// flight before it is handed out (the head's is recorded by the read). The
// records of the workers waiting at the same time go in one statement
// (CursorsMarkInFlight), on a connection of the Marker's own, outside the
// pool: a Transactional worker marks while its transaction holds one of the
// pool's connections, and must not wait for the pool's last one. The
// connection is opened on demand and closed after markerIdle without work.
type Marker struct {
	pool  *pgxpool.Pool
	q     *dbsql.Queries
	group string
	tasks *Tasks // runs the Marker's goroutine

	start   sync.Once
	mu      sync.Mutex
	pending []*markRequest
	wake    chan struct{}
	stopped bool
}

// markRequest is one worker's record to write; done receives its result.
type markRequest struct {
	topic     string
	partition int
	owner     string
	token     int64
	seq       int64
	done      chan bool // true: written; false: the fence did not hold
}

// errMarkerStopped reports a mark asked of a Marker whose Subscriber closed.
var errMarkerStopped = errors.New("outbox: the subscriber is closing")

// markerConnectTimeout bounds the wait for the Marker's connection;
// markerIdle is how long it stays open without work.
const (
	markerConnectTimeout = 5 * time.Second
	markerIdle           = 10 * time.Second
)

// newMarker returns the Marker of consumer group on the outbox in schema;
// its goroutine, started on first use, is one of tasks.
func newMarker(pool *pgxpool.Pool, schema, group string, tasks *Tasks) *Marker {
	return &Marker{pool: pool, q: dbsql.For(schema), group: group, tasks: tasks, wake: make(chan struct{}, 1)}
}

// mark records seq as l's partition's delivery in flight and waits until it
// is written. It starts the Marker's goroutine on first use, one of the
// Marker's tasks, which ends when they stop (a mark asked after that fails
// with errMarkerStopped). ok is false when the fence did not hold (the
// lease is gone or the cursor moved).
func (m *Marker) mark(ctx context.Context, topic string, l Lease, seq int64) (ok bool, err error) {
	m.start.Do(func() { m.tasks.Go(m.run) })
	req := &markRequest{topic: topic, partition: l.Partition(), owner: l.Owner(), token: l.Token(), seq: seq, done: make(chan bool, 1)}
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return false, errMarkerStopped
	}
	m.pending = append(m.pending, req)
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
	select {
	case ok, open := <-req.done:
		if !open {
			return false, errMarkerStopped
		}
		return ok, nil
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
}

// run writes the pending records, all of them in one statement, whenever
// there are some, until stop ends.
func (m *Marker) run(stop context.Context) {
	var conn *pgx.Conn
	closeConn := func() {
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(ctx)
			cancel()
			conn = nil
		}
	}
	idle := time.NewTimer(markerIdle)
	defer idle.Stop()
	defer func() {
		closeConn()
		m.mu.Lock()
		m.stopped = true
		for _, r := range m.pending {
			close(r.done)
		}
		m.pending = nil
		m.mu.Unlock()
	}()
	for {
		select {
		case <-m.wake:
		case <-idle.C:
			closeConn()
			continue
		case <-stop.Done():
			return
		}
		idle.Reset(markerIdle)
		m.mu.Lock()
		batch := m.pending
		m.pending = nil
		m.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		if conn == nil {
			cctx, cancel := context.WithTimeout(stop, markerConnectTimeout)
			c, err := pgx.ConnectConfig(cctx, m.pool.Config().ConnConfig.Copy())
			cancel()
			if err != nil {
				fail(batch, err)
				continue
			}
			conn = c
		}
		written, err := m.write(stop, conn, batch)
		if err != nil {
			closeConn() // a fresh connection next time
			fail(batch, err)
			continue
		}
		for _, r := range batch {
			r.done <- written[r.key()]
		}
	}
}

// fail ends the requests of a batch that could not be written: their
// workers see the fence fail and diagnose their lease.
func fail(batch []*markRequest, _ error) {
	for _, r := range batch {
		r.done <- false
	}
}

type markKey struct {
	topic     string
	partition int
}

func (r *markRequest) key() markKey { return markKey{r.topic, r.partition} }

// write runs CursorsMarkInFlight for batch and returns which records it
// wrote.
func (m *Marker) write(ctx context.Context, conn *pgx.Conn, batch []*markRequest) (map[markKey]bool, error) {
	n := len(batch)
	topics, parts, owners, tokens, seqs := make([]string, n), make([]int32, n), make([]string, n), make([]int64, n), make([]int64, n)
	for i, r := range batch {
		topics[i], parts[i], owners[i], tokens[i], seqs[i] = r.topic, int32(r.partition), r.owner, r.token, r.seq
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	rows, err := conn.Query(wctx, m.q.CursorsMarkInFlight, m.group, topics, parts, owners, tokens, seqs)
	if err != nil {
		return nil, fmt.Errorf("outbox: record deliveries in flight: %w", err)
	}
	defer rows.Close()
	written := make(map[markKey]bool, n)
	for rows.Next() {
		var k markKey
		var p int32
		if err := rows.Scan(&k.topic, &p); err != nil {
			return nil, err
		}
		k.partition = int(p)
		written[k] = true
	}
	return written, rows.Err()
}
