package outbox_test

import (
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
)

// A Sequencer of a zero config (but its pool) runs with the defaults its
// fields document.
func TestSequencerDefaultsAreTheDocumentedOnes(t *testing.T) {
	e := newEnv(t)
	s, err := outbox.NewSequencer(outbox.SequencerConfig{Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := outbox.SequencerConfigOf(s)
	for name, c := range map[string]struct{ got, want any }{
		"Schema":               {got.Schema, outbox.DefaultSchema},
		"BatchSize":            {got.BatchSize, 5000},
		"MaxPartitionsPerPass": {got.MaxPartitionsPerPass, 256},
		"PollInterval":         {got.PollInterval, 500 * time.Millisecond},
		"MaxIdlePoll":          {got.MaxIdlePoll, outbox.DefaultMaxIdlePoll},
		"Debounce":             {got.Debounce, time.Millisecond},
		"MinPassInterval":      {got.MinPassInterval, 20 * time.Millisecond},
	} {
		if c.got != c.want {
			t.Errorf("SequencerConfig.%s defaults to %v, its doc says %v", name, c.got, c.want)
		}
	}
	if got.Clock == nil {
		t.Error("SequencerConfig.Clock has no default")
	}
	if outbox.DefaultMaxIdlePoll != 10*time.Second {
		t.Errorf("DefaultMaxIdlePoll = %v, its doc says 10s", outbox.DefaultMaxIdlePoll)
	}
}
