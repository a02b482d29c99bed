package lease

// Freeze stops (on) or resumes (off) everything m's Run loop does on its
// timers, as if the process stalled: no heartbeat, no renewal, no release.
// Stopping Run still works.
func Freeze(m *Manager, on bool) { m.frozen.Store(on) }

// Share exposes share to the tests.
var Share = share
