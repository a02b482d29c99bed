package consumer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/millrace/watermill-outbox/internal/worker"
)

// Key isolation's bounds, what the cursor row shows of them, the scan's
// waits and the directive a turn with held keys ends with.

// showingStore is the fake store that also keeps what the worker shows on
// the cursor row about the bounds (HeldShowFull), and counts the reads of
// the held table.
type showingStore struct {
	*fakeStore
	mu    sync.Mutex
	shown []bool
	loads int
}

func (s *showingStore) HeldShowFull(_ context.Context, _ string, _ Lease, full bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shown = append(s.shown, full)
	return nil
}

func (s *showingStore) HeldLoad(ctx context.Context, topic string, part int) ([]HeldRow, error) {
	s.mu.Lock()
	s.loads++
	s.mu.Unlock()
	return s.fakeStore.HeldLoad(ctx, topic, part)
}

func (s *showingStore) shows() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.shown)
}

// bounds is key isolation with the given bounds, on store s.
func bounds(s *showingStore, keys, messages int) func(*Config, *fakeLease) {
	return func(c *Config, _ *fakeLease) {
		c.Store = s
		c.Isolation = Isolation{Enabled: true, MaxHeldKeys: keys, MaxHeldMessages: messages}
	}
}

// heldSeqs lists the held seqs of the store, in order.
func heldSeqs(s *fakeStore) []int64 {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	var out []int64
	for seq := range s.Held {
		out = append(out, seq)
	}
	slices.Sort(out)
	return out
}

// Messages are parked behind a held key up to MaxHeldMessages, the head
// included; the next one stops the scan, and the cursor row shows it once.
func TestParkingStopsAtMaxHeldMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &showingStore{fakeStore: newFakeStore()}
		keyed(s.fakeStore, "a", "a", "a", "a", "a", "b")
		r := newRig(t, s.fakeStore, bounds(s, 3, 4), nil)
		for range 4 {
			r.step(map[string]answer{"a1": nack})
		}
		if got := heldSeqs(s.fakeStore); !slices.Equal(got, []int64{1, 2, 3, 4}) {
			t.Fatalf("held %v: want a1 and the 3 messages parked behind it, a5 not", got)
		}
		if c := s.State(); c.Seq != 4 {
			t.Fatalf("scan position %d: want 4, stopped before a5", c.Seq)
		}
		if got := s.shows(); !slices.Equal(got, []bool{true}) {
			t.Fatalf("shown on the cursor row %v: want the bounds reached, once", got)
		}
	})
}

// A failing message is held as a new key while the held messages, those
// parked with it included, stay within MaxHeldMessages (3 here: a1, a2,
// b1).
func TestFailingMessageIsHeldUpToMaxHeldMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &showingStore{fakeStore: newFakeStore()}
		keyed(s.fakeStore, "a", "a", "b")
		r := newRig(t, s.fakeStore, bounds(s, 2, 3), nil)
		how := map[string]answer{"a1": nack, "b1": nack}
		for range 2 {
			r.step(how)
		}
		if got := heldSeqs(s.fakeStore); !slices.Equal(got, []int64{1, 2, 3}) || r.w.iso.full {
			t.Fatalf("held %v, full %v: want a1, a2 and b1 held, within the bounds", got, r.w.iso.full)
		}
	})
}

// Past MaxHeldMessages (2 here: a1 and a2 parked in the same batch), a
// failing message is not held: the partition blocks on it.
func TestFailingMessageBlocksPastMaxHeldMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &showingStore{fakeStore: newFakeStore()}
		keyed(s.fakeStore, "a", "a", "b")
		r := newRig(t, s.fakeStore, bounds(s, 2, 2), nil)
		how := map[string]answer{"a1": nack, "b1": nack}
		for range 2 {
			r.step(how)
		}
		if got := heldSeqs(s.fakeStore); !slices.Equal(got, []int64{1, 2}) || !r.w.iso.full {
			t.Fatalf("held %v, full %v: want a1 and a2 held, b1 not, the bounds reached", got, r.w.iso.full)
		}
		if c := s.State(); c.Seq != 2 || c.Attempts != 1 {
			t.Fatalf("cursor row %+v: want the scan blocked on b1 with its failure", c)
		}
	})
}

// A batch whose messages are all parked behind a held key moves the scan
// past them without a delivery.
func TestBatchOfParkedMessagesMovesTheScan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "a", "a")
		r := newRig(t, s, isolated, nil)
		r.step(map[string]answer{"a1": nack})
		dir, got, err := r.step(nil)
		if err != nil || len(got) != 0 || !dir.Proceeds() {
			t.Fatalf("turn handed out %v, directive %v, err %v: want nothing handed out and the scan to go on", uuids(got), dir, err)
		}
		if c := s.State(); c.Seq != 3 || len(s.Held) != 3 {
			t.Fatalf("scan position %d, held %v: want 3, a2 and a3 parked", c.Seq, s.Held)
		}
	})
}

// When the bounds are reached and the held keys go under them again, the
// cursor row shows it; while they stay at the bounds it does not change.
func TestBoundsShownUntilHeldKeysGoUnderThem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &showingStore{fakeStore: newFakeStore()}
		keyed(s.fakeStore, "a", "b", "c")
		r := newRig(t, s.fakeStore, bounds(s, 2, 4), nil)
		fail := map[string]answer{"a1": nack, "b1": nack, "c1": nack}
		for range 3 {
			r.step(fail)
		}
		if !r.w.iso.full || !slices.Equal(s.shows(), []bool{true}) {
			t.Fatalf("full %v, shown %v: want the bounds reached (2 keys held, c1 blocking)", r.w.iso.full, s.shows())
		}
		time.Sleep(time.Second)
		r.step(fail) // the held keys fail again: still 2 of 2 keys
		if !r.w.iso.full || !slices.Equal(s.shows(), []bool{true}) {
			t.Fatalf("full %v, shown %v: want the bounds still reached", r.w.iso.full, s.shows())
		}
		time.Sleep(time.Second)
		r.step(map[string]answer{"b1": nack, "c1": nack}) // a1 released: 1 key, 1 message
		if got := s.shows(); len(got) < 2 || got[1] {
			t.Fatalf("shown %v: want the bounds reached, then left", got)
		}
	})
}

// A held row's error says how its message failed: a nack without a reason
// is "nacked".
func TestHeldRowSaysNacked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a")
		r := newRig(t, s, isolated, nil)
		r.step(map[string]answer{"a1": nack})
		if h := s.Held[1]; h == nil || !strings.HasSuffix(h.Err, "attempt 1: nacked") {
			t.Fatalf("held %v: want a1 held, its error \"seq 1, attempt 1: nacked\"", s.Held)
		}
	})
}

// A new lease holder that finds the scan's head charged with failures (its
// consumer crashed with it alone in flight) holds it at once, without
// another delivery, and goes on with the other keys.
func TestChargedHeadIsHeldAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "b")
		s.Cursor.Attempts, s.Cursor.LastError = 1, "crashed alone"
		r := newRig(t, s, func(c *Config, l *fakeLease) {
			isolated(c, l)
			l.Found.Charged = 1
		}, nil)
		var handed []string
		for range 2 {
			_, got, _ := r.step(nil)
			handed = append(handed, uuids(got)...)
		}
		if !slices.Equal(handed, []string{"m2"}) {
			t.Fatalf("handed out %v: want only b1, a1 held without a delivery", handed)
		}
		if h := s.Held[1]; h == nil || h.Attempts != 1 || !strings.Contains(h.Err, "crashed alone") {
			t.Fatalf("held %v: want a1 held with its charged failure", s.Held)
		}
	})
}

// A backoff found on the cursor row at acquisition holds the scan back for
// exactly that long.
func TestInitialBackoffHoldsTheScanBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a")
		r := newRig(t, s, func(c *Config, l *fakeLease) {
			isolated(c, l)
			l.Found.Backoff = 300 * time.Millisecond
		}, nil)
		dir, got, _ := r.step(nil)
		if d, ok := dir.SleepDelay(); !ok || d != 300*time.Millisecond || len(got) != 0 {
			t.Fatalf("first turn: directive %v, handed out %v: want a sleep of 300ms, nothing handed out", dir, uuids(got))
		}
		time.Sleep(300 * time.Millisecond)
		if _, got, _ := r.step(nil); !slices.Equal(uuids(got), []string{"m1"}) {
			t.Fatalf("after the backoff handed out %v, want a1", uuids(got))
		}
	})
}

// A turn that finds nothing to do while keys are held idles only until the
// next held retry is due.
func TestIdleTurnWakesForTheNextHeldRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a")
		r := newRig(t, s, isolated, nil)
		r.step(map[string]answer{"a1": nack})
		dir, _, _ := r.step(nil)
		want := time.Until(s.Held[1].RetryAt)
		if dir.Proceeds() || dir.Delay() != want {
			t.Fatalf("directive %v: want an idle of %v, until a1's retry", dir, want)
		}
		if dir == worker.Idle() {
			t.Fatalf("directive %v: want a bounded idle", dir)
		}
	})
}

// A worker that holds nothing does not read the held table again.
func TestNothingHeldNoReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &showingStore{fakeStore: newFakeStore()}
		keyed(s.fakeStore, "a")
		r := newRig(t, s.fakeStore, bounds(s, 2, 4), nil)
		for range 3 {
			r.step(nil)
			time.Sleep(2 * heldReloadEvery)
		}
		if s.loads != 1 {
			t.Fatalf("held table read %d times: want once, at the first turn", s.loads)
		}
	})
}

// A head whose failures on the cursor row are not a crash's charge (it was
// nacked while the bounds were reached) is delivered again by the next
// holder, not held at once.
func TestUnchargedFailedHeadIsDeliveredAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "b")
		s.Cursor.Attempts, s.Cursor.LastError = 1, "seq 1, attempt 1: nacked"
		r := newRig(t, s, isolated, nil)
		_, got, _ := r.step(nil)
		if len(got) == 0 || got[0].UUID != "m1" || len(s.Held) != 0 {
			t.Fatalf("handed out %v, held %v: want a1 delivered again, nothing held", uuids(got), s.Held)
		}
	})
}

// A scan backing off sleeps only until the next held retry is due.
func TestScanBackoffWakesForTheNextHeldRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "b")
		heldAlready(s, 1, 1, time.Now().Add(100*time.Millisecond))
		r := newRig(t, s, func(c *Config, l *fakeLease) {
			isolated(c, l)
			l.Found.Backoff = 5 * time.Second
		}, nil)
		dir, got, _ := r.step(nil)
		if d, ok := dir.SleepDelay(); !ok || d != 100*time.Millisecond || len(got) != 0 {
			t.Fatalf("directive %v, handed out %v: want a sleep of 100ms, until a1's retry", dir, uuids(got))
		}
	})
}

// With the Transactional strategy, the scan's move commits with the
// handler's writes: when the commit fails, neither happened.
func TestIsolatedTransactionalCommitFailureMovesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a")
		s.Fail["commit"] = errors.New("connection reset")
		r := newRig(t, s, func(c *Config, l *fakeLease) {
			transactional(c, l)
			isolated(c, l)
		}, nil)
		r.step(map[string]answer{"a1": write})
		if c := s.State(); c.Seq != 0 || len(s.CommittedEffects()) != 0 {
			t.Fatalf("cursor row %+v, effects %v: want neither the scan move nor the write", c, s.CommittedEffects())
		}
	})
}
