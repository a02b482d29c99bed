package outbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// statementTracer records, for each round trip a pgx connection makes
// (a statement sent alone, or a pipeline), how many of its statements
// contain a given text.
type statementTracer struct {
	match string

	mu         sync.Mutex
	trips      int // round trips carrying at least one match
	statements int // matching statements
	inBatch    map[*pgx.Conn]int
}

func (s *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, s.match) {
		s.mu.Lock()
		s.trips++
		s.statements++
		s.mu.Unlock()
	}
	return ctx
}
func (s *statementTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *statementTracer) TraceBatchStart(ctx context.Context, c *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.mu.Lock()
	s.inBatch[c] = 0
	s.mu.Unlock()
	return ctx
}
func (s *statementTracer) TraceBatchQuery(_ context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, s.match) {
		s.mu.Lock()
		s.inBatch[c]++
		s.statements++
		s.mu.Unlock()
	}
}
func (s *statementTracer) TraceBatchEnd(_ context.Context, c *pgx.Conn, _ pgx.TraceBatchEndData) {
	s.mu.Lock()
	if s.inBatch[c] > 0 {
		s.trips++
	}
	delete(s.inBatch, c)
	s.mu.Unlock()
}

func (s *statementTracer) counts() (trips, statements int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.trips, s.statements
}

// Partitions acked at the same moment move their cursors in shared round
// trips (internal/pgcombine): eight workers whose messages are acked
// together do not pay eight round trips for their cursor moves. (Each paid
// its own.)
func TestCursorMovesOfPartitionsAckedTogetherShareRoundTrips(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const partitions, held = 16, 8
	e.Register("together", partitions)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	tracer := &statementTracer{match: ".cursors SET seq = ", inBatch: map[*pgx.Conn]int{}}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(outboxtest.Ctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	uuids := publishKeyed(t, e, "together", 200, 1)
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Schema: e.Schema, Pool: pool, ConsumerGroup: "g"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "together")
	if err != nil {
		t.Fatal(err)
	}
	// Hold the first messages until eight partitions each have one in hand
	// (a partition hands out one at a time), then ack them all at once.
	var inHand []*message.Message
	seen := map[string]bool{}
	for len(inHand) < held {
		m := <-msgs
		if p := m.Metadata.Get(outbox.MetadataPartition); seen[p] {
			t.Fatalf("partition %s handed out a second message before the first was acked", p)
		} else {
			seen[p] = true
		}
		inHand = append(inHand, m)
	}
	for _, m := range inHand {
		m.Ack()
	}
	for range len(uuids) - held {
		(<-msgs).Ack()
	}
	outboxtest.WaitFor(t, "every cursor moved past its messages", time.Minute, func() bool {
		var left int64
		if err := e.Pool.QueryRow(outboxtest.Ctx(t), `SELECT count(*) FROM `+e.Schema+`.log l JOIN `+e.Schema+`.cursors c
			ON c.group_name = 'g' AND c.topic = l.topic AND c.partition = l.partition WHERE l.topic = 'together' AND l.seq > c.seq`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	})
	trips, statements := tracer.counts()
	t.Logf("%d cursor moves in %d round trips", statements, trips)
	if statements < held {
		t.Fatalf("%d cursor moves traced, want at least the %d partitions acked together: the tracer misses some", statements, held)
	}
	if trips >= statements {
		t.Fatalf("%d cursor moves took %d round trips: the %d acked together did not share one", statements, trips, held)
	}
}
