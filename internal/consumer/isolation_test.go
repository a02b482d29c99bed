package consumer

import (
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Key isolation: a failing message is held back with its key, the others
// go on.

// isolated turns key isolation on, with bounds of 2 keys and 4 messages.
func isolated(c *Config, _ *fakeLease) {
	c.Isolation = Isolation{Enabled: true, MaxHeldKeys: 2, MaxHeldMessages: 4}
}

// keyed appends messages of the given keys (payload "<key><n>").
func keyed(s *fakeStore, keys ...string) {
	n := map[string]int{}
	for _, k := range keys {
		n[k]++
		s.Append(Entry{Key: k, Payload: []byte(k + string(rune('0'+n[k])))})
	}
}

// A message that fails is held with its key; the later messages of its key
// are parked behind it, the other keys go on at once.
func TestFailingKeyIsHeldWhileOthersFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "b", "a", "b")
		r := newRig(t, s, isolated, nil)
		dir, _, err := r.step(map[string]answer{"a1": nack})
		if err != nil || !dir.Proceeds() {
			t.Fatalf("directive %v, err %v: want the partition to go on", dir, err)
		}
		_, got, _ := r.step(map[string]answer{"a1": nack})
		if !slices.Equal(uuids(got), []string{"m2", "m4"}) {
			t.Fatalf("second turn handed out %v: want b's messages, not a's", uuids(got))
		}
		if len(s.Held) != 2 || s.Held[1] == nil || s.Held[3] == nil || s.Held[1].Err == "" || s.Held[3].Err != "" {
			t.Fatalf("held %v: want a1 (failed) and a2 (parked)", s.Held)
		}
		if c := s.State(); c.Seq != 4 {
			t.Fatalf("scan position %d, want 4", c.Seq)
		}
	})
}

// A held key's retry comes after its backoff; when it succeeds, the key
// is released and its parked messages follow, in order.
func TestHeldKeyIsRetriedAndReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "b", "a")
		r := newRig(t, s, isolated, nil)
		fail := true
		how := map[string]answer{"a1": func(m *message.Message) {
			if fail {
				m.Nack()
				return
			}
			m.Ack()
		}}
		r.step(how)
		r.step(how)
		fail = false
		time.Sleep(2 * time.Second) // the held key's backoff
		var handed []string
		for range 3 {
			_, got, _ := r.step(how)
			handed = append(handed, uuids(got)...)
		}
		if !slices.Equal(handed, []string{"m1", "m3"}) || len(s.Held) != 0 {
			t.Fatalf("after the backoff handed out %v, held %v: want a1 then a2, nothing held", handed, s.Held)
		}
	})
}

// A held message that keeps failing is dead-lettered after MaxAttempts.
func TestHeldMessageIsDeadLetteredAfterMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a")
		r := newRig(t, s, isolated, nil)
		for range 6 {
			r.step(map[string]answer{"a1": nack})
			time.Sleep(2 * time.Second)
		}
		taken := r.rejects.taken()
		if len(taken) != 1 || taken[0].UUID != "m1" || len(s.Held) != 0 {
			t.Fatalf("rejected %+v, held %v", taken, s.Held)
		}
	})
}

// Past the bounds, the partition blocks on its failing message as without
// isolation, and says so.
func TestIsolationBoundsFallBackToBlocking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		keyed(s, "a", "b", "c", "d")
		r := newRig(t, s, isolated, nil)
		how := map[string]answer{"a1": nack, "b1": nack, "c1": nack}
		for range 3 {
			r.step(how)
		}
		if len(s.Held) != 2 || !r.w.iso.full {
			t.Fatalf("held %v, full %v: want two keys held and the bounds reached", s.Held, r.w.iso.full)
		}
		if c := s.State(); c.Seq != 2 || c.Attempts != 1 || !strings.Contains(c.LastError, "seq 3") {
			t.Fatalf("cursor row %+v: want the scan blocked on c1 with its failure recorded", c)
		}
	})
}
