// Package adaptive holds the tuning profiles of a subscriber's partition
// workers: [Tuning], the part of outbox.SubscriberConfig a profile sets,
// and the four profiles [Default], [LowLatency], [HighThroughput] and
// [Background] ([Profile] looks one up by name).
//
// A partition worker adapts to what it meets. It reads Tuning.BatchSize
// messages per batch; after failed batches in a row it shrinks the batch
// to the messages that succeeded before the failure (at least one), which
// isolates a poison message quickly, and doubles it back after each batch
// that succeeds. It retries a failed batch after BackoffBase, doubling
// with each further failure up to BackoffMax. While polls keep finding
// work it polls again soon, ever sooner while the backlog lasts; after a
// poll that found nothing it waits for a notification, or polls again
// after the idle poll interval (outbox.SubscriberConfig.Advanced's
// PollInterval). How soon a batch shrinks, the pace of a backlog and the
// pace of the subscriber's own sequencer are the profile's choice, not
// fields: pick the profile whose behaviour you want, then change its
// fields.
//
// A zero field of a Tuning takes its profile's value, field by field
// ([Default]'s for a Tuning made by hand): Tuning{BatchSize: 200} is
// Default() with batches of 200. [Tuning.Validate] reports an impossible
// value as a [*outboxtype.ConfigError] matching outbox.ErrInvalidConfig.
package adaptive
