package relay

// NeverConfirm makes relays of this process never confirm a position to
// the server, so that a restarted relay reads again everything appended.
func NeverConfirm(on bool) { neverConfirm.Store(on) }

// PauseAt calls f at the named points of every append ("advanced",
// "copy"); nil removes it.
func PauseAt(f func(point string)) {
	if f == nil {
		testPause.Store(nil)
		return
	}
	testPause.Store(&f)
}
