package direct

// Notified delivers a notification of the pending channel with payload to
// the loop, as its listener does.
func (l *Loop) Notified(payload string) { l.notified(payload) }

// SetLive makes the loop, which runs without a database listener in the
// tests, take its notifications as trusted while live says so.
func (l *Loop) SetLive(live func() bool) { l.live = live }
