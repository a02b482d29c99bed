package outbox

import (
	"testing"

	"github.com/millrace/watermill-outbox/internal/names"
)

// A publisher's notification (any payload, "" today) wakes the sequencer;
// the log-based relay's, which announces forwarder-only messages the
// sequencer leaves alone, does not.
func TestSequencerWakesOnPublishersNotTheRelay(t *testing.T) {
	if !sequencerWakesOn("") {
		t.Fatal("a publisher's notification does not wake the sequencer")
	}
	if sequencerWakesOn(names.RelayedPayload) {
		t.Fatal("the relay's notification of forwarder-only messages wakes the sequencer")
	}
}
