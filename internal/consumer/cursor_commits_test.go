package consumer

import (
	"fmt"
	"testing"
	"testing/synctest"
)

// The Leased strategy moves its cursor without waiting for the WAL flush
// (a server crash then delivers the batch again), unless
// SyncCursorCommits; the Transactional one commits its cursor with the
// handlers' writes, never relaxed. The same holds for a scan move that
// writes parked messages (key isolation).

func TestLeasedCursorMovesAreRelaxedUnlessSyncCursorCommits(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprint("sync=", sync), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newFakeStore("a", "b")
				r := newRig(t, s, func(c *Config, _ *fakeLease) { c.SyncCursorCommits = sync }, nil)
				if _, got, err := r.step(nil); err != nil || len(got) != 2 {
					t.Fatalf("handed out %d, err %v", len(got), err)
				}
				if c := s.State(); c.Seq != 2 {
					t.Fatalf("cursor %d, want 2", c.Seq)
				}
				want := int64(1)
				if sync {
					want = 0
				}
				if n := r.lease.RelaxedMoves.Load(); n != want {
					t.Fatalf("relaxed cursor moves %d, want %d", n, want)
				}
			})
		})
	}
}

func TestTransactionalCursorMovesAreNeverRelaxed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b")
		r := newRig(t, s, func(c *Config, _ *fakeLease) { c.Transactional = true }, nil)
		if _, got, err := r.step(nil); err != nil || len(got) != 2 {
			t.Fatalf("handed out %d, err %v", len(got), err)
		}
		if c := s.State(); c.Seq != 2 {
			t.Fatalf("cursor %d, want 2", c.Seq)
		}
		if n := r.lease.RelaxedMoves.Load(); n != 0 || s.RelaxedCommits != 0 {
			t.Fatalf("relaxed moves %d, relaxed commits %d: want none", n, s.RelaxedCommits)
		}
	})
}

func TestParkingScanMovesAreRelaxedUnlessSyncCursorCommits(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprint("sync=", sync), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newFakeStore()
				keyed(s, "a", "b", "a", "b")
				r := newRig(t, s, func(c *Config, l *fakeLease) {
					isolated(c, l)
					c.SyncCursorCommits = sync
				}, nil)
				r.step(map[string]answer{"a1": nack}) // a1 held
				r.step(map[string]answer{"a1": nack}) // a2 parked behind it
				if len(s.Held) != 2 {
					t.Fatalf("held %v: want a1 and a2", s.Held)
				}
				if sync && s.RelaxedCommits != 0 {
					t.Fatalf("%d relaxed commits with SyncCursorCommits", s.RelaxedCommits)
				}
				if !sync && s.RelaxedCommits == 0 {
					t.Fatal("no relaxed commit of the scan moves that held and parked")
				}
			})
		})
	}
}
