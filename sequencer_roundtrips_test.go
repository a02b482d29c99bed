package outbox_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// A sequencer pass is what a message pays on its way between publish and
// delivery, at light load once per message or two: it takes two round
// trips when it moves messages (BEGIN pipelined with the partition lock,
// the move pipelined with COMMIT), and two when the partitions it may lock
// hold nothing. (It took four and three.)
func TestSequencerPassTakesTwoRoundTrips(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("trips", 4)
	pool, trips := countingPool(t)
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
