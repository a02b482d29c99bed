package outbox

import "context"

// MetadataDeliverAt is the metadata key of a delayed message's time, for
// the tests that write or check it by hand.
const MetadataDeliverAt = metadataDeliverAt

// Pass runs one sequencing pass (Sequencer.pass), for the tests that count
// what one pass costs; applications use Run or SequenceAll.
func (s *Sequencer) Pass(ctx context.Context) (n int, more bool, err error) { return s.pass(ctx) }

// SetExitHook makes each background goroutine of s call f, with its name,
// as it ends (after Close told it to stop): "subscription" (one per
// Subscribe or ConsumeBatches, its channel closed by then), "listener",
// "sequencer" and "tasks" (once the workers' Tasks stopped). A test blocks
// one in f to see that Close waits for it. Call it before s is used.
func SetExitHook(s *Subscriber, f func(what string)) { s.exit = f }

// SequencerLooks counts the unprompted looks (the one-statement check for
// pending work) s's Run made so far.
func SequencerLooks(s *Sequencer) int64 { return s.looks.Load() }

// SequencerConfigOf is the configuration s runs with, its defaults filled
// in.
func SequencerConfigOf(s *Sequencer) SequencerConfig { return s.cfg }
