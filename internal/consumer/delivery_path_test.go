package consumer

import (
	"testing"
	"testing/synctest"

	"github.com/millrace/watermill-outbox/internal/worker"
)

// One delivery, and nothing else: a message read, handed out, acked and
// its cursor moved, by the Leased strategy. internal/tools/deliverypath
// runs it with coverage to measure the path a reader follows through the
// core (docs/bench-results/delivery-path), so it ends without the worker's
// Stop, which is not part of a delivery.
func TestOneDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, nil, nil)
		r.unstopped = true
		dir, got, err := r.step(nil)
		if err != nil || dir != worker.Idle() || len(got) != 1 {
			t.Fatalf("directive %v, err %v, %d handed out; want idle after one", dir, err, len(got))
		}
		if c := s.State(); c.Seq != 1 || c.Attempts != 0 || c.Deliveries != 0 || c.InflightTo != 0 {
			t.Fatalf("cursor row %+v: want seq 1, nothing counted or in flight", c)
		}
		if n := r.cfg.Counts.Acked.Load(); n != 1 {
			t.Fatalf("acked %d, want 1", n)
		}
	})
}
