package tune_test

import (
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/internal/tune"
)

// An idle loop's wait doubles up to its poll interval, and on up to
// Max only while notifications are trusted: its LISTEN is live and
// no unprompted look at the idle pace found work since a notified pass
// did.
func TestIdlePollStretchesOnlyWhileNotificationsAreTrusted(t *testing.T) {
	const ms = time.Millisecond
	live := true
	p := tune.IdlePoll{Base: 100 * ms, Max: 800 * ms, Live: func() bool { return live }}
	doubling := func(from time.Duration, steps int) []time.Duration {
		var out []time.Duration
		for range steps {
			from = p.Next(from)
			out = append(out, from)
		}
		return out
	}
	check := func(what string, got []time.Duration, want ...time.Duration) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: waits %v, want %v", what, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: waits %v, want %v", what, got, want)
			}
		}
	}
	check("listening", doubling(0, 6), 100*ms, 200*ms, 400*ms, 800*ms, 800*ms, 800*ms)
	check("after a pass", doubling(20*ms, 5), 40*ms, 80*ms, 160*ms, 320*ms, 640*ms)

	live = false // the LISTEN connection dropped: back to PollInterval
	check("not listening", doubling(800*ms, 3), 100*ms, 100*ms, 100*ms)
	live = true

	p.Unannounced(50 * ms) // a follow-up soon after a pass finds work: expected
	check("found by a follow-up", doubling(400*ms, 2), 800*ms, 800*ms)
	p.Unannounced(800 * ms) // at the idle pace: the notifications missed it
	check("missed", doubling(20*ms, 5), 40*ms, 80*ms, 100*ms, 100*ms, 100*ms)
	p.Announced() // a notified pass found work
	check("announced again", doubling(100*ms, 4), 200*ms, 400*ms, 800*ms, 800*ms)

	none := tune.IdlePoll{Base: 100 * ms, Max: 800 * ms} // DisableListen
	if w := none.Next(100 * ms); w != 100*ms {
		t.Fatalf("a sequencer that does not listen stretched its poll to %v", w)
	}
	for _, max := range []time.Duration{-1, 50 * ms, 100 * ms} { // no stretch
		q := tune.IdlePoll{Base: 100 * ms, Max: max, Live: func() bool { return true }}
		if w := q.Next(100 * ms); w != 100*ms {
			t.Fatalf("MaxIdlePoll %v: the poll stretched to %v", max, w)
		}
	}
}
