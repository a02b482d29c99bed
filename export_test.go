package outbox

// SequencerLooks counts the unprompted looks (the one-statement check for
// pending work) s's Run made so far.
func SequencerLooks(s *Sequencer) int64 { return s.looks.Load() }
