package relay

// NeverConfirm makes relays of this process never confirm a position to
// the server, so that a restarted relay reads again everything appended.
func NeverConfirm(on bool) { neverConfirm.Store(on) }
