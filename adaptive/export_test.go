package adaptive

// ProfileNames returns the names Profile accepts, for the tests that try
// each.
var ProfileNames = profileNames
