package notifier

import (
	"testing"
	"time"
)

// SetHeldLongEnough sets how long a connection must hold for its loss to
// start a new streak of failures, until t ends.
func SetHeldLongEnough(t testing.TB, d time.Duration) {
	old := heldLongEnough
	heldLongEnough = d
	t.Cleanup(func() { heldLongEnough = old })
}
