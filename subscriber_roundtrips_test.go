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
// contain a given text, and how many calls they carried: one for a single
// statement (match), the length of the array argument merged of a merged
// one (matchMerged, internal/pgcombine).
type statementTracer struct {
	match, matchMerged string
	mergedArg          int // the argument whose length is the calls

	mu         sync.Mutex
	trips      int // round trips carrying at least one match
	statements int // matching statements
	calls      int // the calls they carried
	inBatch    map[*pgx.Conn]int
}

// carried returns how many calls the statement sql carries (0: not a
// match).
func (s *statementTracer) carried(sql string, args []any) int {
	switch {
	case strings.Contains(sql, s.match):
		return 1
	case s.matchMerged != "" && strings.Contains(sql, s.matchMerged) && len(args) > s.mergedArg:
		if a, ok := args[s.mergedArg].([]int64); ok {
			return len(a)
		}
	}
	return 0
}

func (s *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if n := s.carried(d.SQL, d.Args); n > 0 {
		s.mu.Lock()
		s.trips++
		s.statements++
		s.calls += n
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
	if n := s.carried(d.SQL, d.Args); n > 0 {
		s.mu.Lock()
		s.inBatch[c]++
		s.statements++
		s.calls += n
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

func (s *statementTracer) counts() (trips, statements, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.trips, s.statements, s.calls
}

// Partitions acked at the same moment move their cursors in shared round
// trips and statements (internal/pgcombine): eight workers whose messages
// are acked together do not pay eight round trips, nor eight statements,
// for their cursor moves. (Each paid its own; then each its statement in a
// shared round trip.)
func TestCursorMovesOfPartitionsAckedTogetherShareRoundTrips(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const partitions, held = 16, 8
	e.Register("together", partitions)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	tracer := &statementTracer{match: ".cursors SET seq = ", matchMerged: ".cursors c SET seq = r.to_seq", mergedArg: 5, inBatch: map[*pgx.Conn]int{}}
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
	trips, statements, moves := tracer.counts()
	t.Logf("%d cursor moves in %d statements, %d round trips", moves, statements, trips)
	if moves < held {
		t.Fatalf("%d cursor moves traced, want at least the %d partitions acked together: the tracer misses some", moves, held)
	}
	if trips >= moves {
		t.Fatalf("%d cursor moves took %d round trips: the %d acked together did not share one", moves, trips, held)
	}
	if statements >= moves {
		t.Fatalf("%d cursor moves took %d statements: the %d acked together did not share one", moves, statements, held)
	}
}
