// Package tune holds the pure decision logic a partition worker paces
// itself by, and the values of the tuning profiles. Nothing in it performs
// I/O or starts goroutines.
//
// # Batch sizing
//
// [Mode] is a small per-partition state machine, similar in spirit to TCP
// slow start. A worker starts in [Normal] state and reads
// [ModeConfig.BatchSize] messages per batch. After
// [ModeConfig.DegradeAfter] consecutive failed batches it enters
// [Degraded] state and shrinks the batch to the number of messages that
// were handled successfully before the failure (at least one), which
// isolates a poison message quickly. Every successful batch in Degraded
// state doubles the batch size again until it reaches the configured size,
// at which point the mode returns to Normal. A rejected message (a
// permanent, per-message failure that has been dead-lettered) shrinks the
// batch at once but does not count as a failure, so it never causes a
// backoff.
//
// The retry delay after a failed batch grows exponentially:
// BackoffBase·2^(n-1) for the n-th consecutive failure, capped at
// BackoffMax (see [ExponentialBackoff]).
//
// # Pacing
//
// [Pacing] decides how long a worker waits between polls:
//
//   - after a poll that found work and expects more, the first wait is
//     ActiveInterval; each further consecutive productive poll shortens
//     the wait by RampStep, never going below MinInterval;
//   - after a poll that found nothing, the worker waits up to
//     IdleInterval (a safety-net poll) unless it is poked earlier, and the
//     next productive streak starts again at ActiveInterval.
//
// # Profiles
//
// A [Profile] is every value of one of the tuning profiles the public
// package adaptive offers (adaptive.Default(), LowLatency(),
// HighThroughput(), Background()): the values a user may change
// (adaptive.Tuning's fields and the defaults of
// outbox.SubscriberConfig.Advanced) and the ones that are the profile's
// own (DegradeAfter, the pacing ramp, the sequencer's pace).
// [Profile.Settings] resolves what a subscription's partition workers use.
//
// Mode is not safe for concurrent use: each partition worker owns its own.
package tune
