package outbox

import "context"

// MetadataDeliverAt is the metadata key of a delayed message's time, for
// the tests that write or check it by hand.
const MetadataDeliverAt = metadataDeliverAt

// Pass runs one sequencing pass (Sequencer.pass), for the tests that count
// what one pass costs; applications use Run or SequenceAll.
func (s *Sequencer) Pass(ctx context.Context) (n int, more bool, err error) { return s.pass(ctx) }
