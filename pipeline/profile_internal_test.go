package pipeline

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/relay"
)

// One profile sets the whole pipeline: the forwarder's tuning gives the
// sequencer's and the relay's pace where they leave it zero, and a pace
// set by hand is kept.
func TestThePipelineFollowsTheForwardersProfile(t *testing.T) {
	pool := &pgxpool.Pool{}
	for name, c := range map[string]struct {
		tuning        adaptive.Tuning
		setSequencer  time.Duration
		wantSequencer time.Duration
		wantRelay     time.Duration
	}{
		"LowLatency":               {adaptive.LowLatency(), 0, 2 * time.Millisecond, 2 * time.Millisecond},
		"Background":               {adaptive.Background(), 0, 100 * time.Millisecond, 100 * time.Millisecond},
		"a zero Tuning: Default's": {adaptive.Tuning{}, 0, 20 * time.Millisecond, 20 * time.Millisecond},
		"a pace set by hand":       {adaptive.LowLatency(), 7 * time.Millisecond, 7 * time.Millisecond, 2 * time.Millisecond},
	} {
		cfg := Config{Pool: pool, WAL: &relay.Config{}}
		cfg.Forward.Subscriber.Tuning = c.tuning
		cfg.Sequencer.MinPassInterval = c.setSequencer
		if err := cfg.withSchema(); err != nil {
			t.Fatal(err)
		}
		if cfg.Sequencer.MinPassInterval != c.wantSequencer || cfg.WAL.MinAppendInterval != c.wantRelay {
			t.Errorf("%s: sequencer pace %v, relay pace %v; want %v and %v", name, cfg.Sequencer.MinPassInterval, cfg.WAL.MinAppendInterval, c.wantSequencer, c.wantRelay)
		}
	}
}
