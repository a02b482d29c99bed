package direct

// Notified delivers a notification of the pending channel with payload to
// the loop, as its listener does.
func (l *Loop) Notified(payload string) { l.notified(payload) }
