package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// roundTrips counts what a pool sends to the server: each statement sent
// alone and each pipeline (pgx batch) is one round trip.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A sequencer pass is what a message pays on its way between publish and
// delivery, at light load once per message or two: it takes two round
// trips when it moves messages (BEGIN pipelined with the partition lock,
// the move pipelined with COMMIT), and two when the partitions it may lock
// hold nothing. (It took four and three.)
func TestSequencerPassTakesTwoRoundTrips(t *testing.T) {
	e := newEnv(t)
	e.Register("trips", 4)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(outboxtest.Ctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: pool, DisableListen: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := outboxtest.Ctx(t)
	if _, _, err := s.Pass(ctx); err != nil { // checks the schema once, warms the statement cache
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		if err := pub.Publish("trips", message.NewMessage("m", nil), message.NewMessage("n", nil)); err != nil {
			t.Fatal(err)
		}
		before := trips.n.Load()
		n, _, err := s.Pass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := trips.n.Load() - before; n != 2 || got != 2 {
			t.Errorf("round %d: a pass moved %d messages in %d round trips; want 2 in 2", round, n, got)
		}
		before = trips.n.Load()
		if n, _, err = s.Pass(ctx); err != nil || n != 0 {
			t.Fatalf("an empty pass: %d, %v", n, err)
		}
		if got := trips.n.Load() - before; got != 2 {
			t.Errorf("round %d: an empty pass took %d round trips; want 2", round, got)
		}
	}
	if rows := e.readLog(t, "trips"); len(rows) != 6 {
		t.Fatalf("%d messages in the log, want 6", len(rows))
	}
}
