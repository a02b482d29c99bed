// Package adaptive holds the pure decision logic a partition worker needs to
// pace itself: how many messages to read next, how long to back off after a
// failure, and how long to wait between polls. Nothing in it performs I/O or
// starts goroutines.
//
// # Batch sizing
//
// [Mode] is a small per-partition state machine, similar in spirit to TCP slow
// start. A worker starts in [Normal] state and reads [ModeConfig.BatchSize]
// messages per batch. After [ModeConfig.DegradeAfter] consecutive failed
// batches it enters [Degraded] state and shrinks the batch to the number of
// messages that were handled successfully before the failure (at least one),
// which isolates a poison message quickly. Every successful batch in Degraded
// state doubles the batch size again until it reaches the configured size,
// at which point the mode returns to Normal. A rejected message (a permanent,
// per-message failure that has been dead-lettered) shrinks the batch at once
// but does not count as a failure, so it never causes a backoff.
//
// The retry delay after a failed batch grows exponentially:
// BackoffBase·2^(n-1) for the n-th consecutive failure, capped at BackoffMax
// (see [ExponentialBackoff]).
//
// # Pacing
//
// [Pacing] decides how long a worker waits between polls:
//
//   - after a poll that found work and expects more, the first wait is
//     ActiveInterval; each further consecutive productive poll shortens the
//     wait by RampStep, never going below MinInterval;
//   - after a poll that found nothing, the worker waits up to IdleInterval
//     (a safety-net poll) unless it is poked earlier, and the next productive
//     streak starts again at ActiveInterval.
//
// # Tuning profiles
//
// [Tuning] bundles all knobs of a subscriber's partition workers. Four named
// profiles cover common needs: [Default], [LowLatency], [HighThroughput] and
// [Relaxed]; [Profile] looks one up by name. Every configuration type has a
// Validate method whose errors are [*ConfigError] values matching
// [ErrInvalidConfig].
//
// Mode is not safe for concurrent use: each partition worker owns its own.
// Use [Mode.Status] to hand a consistent copy of its state to other goroutines
// (for example an admin status endpoint).
package adaptive
