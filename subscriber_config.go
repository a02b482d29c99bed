package outbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// SubscriberConfig configures a Subscriber. Pool and ConsumerGroup are
// required; every other field may be left zero, and a zero field takes
// its default, field by field, so that setting one field never
// invalidates the others. docs/configuration.md lists every field with its
// default in one table.
type SubscriberConfig struct {
	// Schema is the outbox schema (DefaultSchema when empty).
	Schema string
	// Pool is the connection pool. Required.
	Pool *pgxpool.Pool
	// ConsumerGroup names the group whose cursor this subscriber advances.
	// Subscribers in one group share the partitions; each group sees every
	// message. Required: 1 to 200 bytes of UTF-8 without control or format
	// characters (a *outboxtype.NameError otherwise).
	ConsumerGroup string
	// Strategy is Leased (default) or Transactional.
	Strategy Strategy
	// Tuning sets the batch size, the retry backoff and the lease TTL,
	// over a profile (adaptive.Default() when made by hand): a zero field
	// takes its profile's value. The profile also chooses the defaults of
	// Advanced and how the workers pace themselves (see package adaptive).
	Tuning adaptive.Tuning
	// RejectHandler takes rejected (poison) messages out of the stream.
	// Default: the schema's own dead-letter table, written as
	// deadletter.Store writes it (list, replay and discard them with
	// package deadletter, the CLI's dlq commands or the console). Set it to
	// send them elsewhere, e.g. a deadletter.Store with other settings or a
	// poison queue.
	RejectHandler outboxtype.RejectHandler
	// MaxAttempts takes a message out of the stream (outboxtype.RejectHandler) once it
	// was delivered that many times without success. Default
	// DefaultMaxAttempts (10: with Default()'s backoff, 1 s doubling to
	// 1 min, about four minutes of retries, long enough to ride out a
	// restart of what the handler calls, short enough that one bad message
	// does not stall its partition for long); RetryForever never takes a
	// message out for its failures (a handler can still Reject it), and
	// the partition waits as long as it fails. The Forwarder defaults to
	// RetryForever: its targets reject what no retry can cure on the first
	// attempt, and a broker outage must not dead-letter healthy messages.
	// Every failure counts: a Nack, an error, a HandlerTimeout, a
	// transaction the handler broke, a missing payload, and a delivery
	// that ended without any outcome
	// because the consumer process died, was killed or lost its lease while
	// it was the only delivery in flight in that process. A crash with
	// several deliveries in flight charges none of them: they are delivered
	// again one at a time, each alone in its process, until the one that
	// crashes it is found (docs/failure-modes.md §3).
	MaxAttempts int
	// HandlerTimeout bounds how long the Subscriber waits for a handler's
	// Ack or Nack (or a BatchHandler's return), in both strategies
	// (default 2/3 of Tuning.LeaseTTL, so that it ends before the lease
	// can; when it is set and Tuning.LeaseTTL is not, the lease TTL's
	// default is at least 3/2 of it). The message's context ends then too.
	// A handler that has not answered by then is abandoned: the delivery
	// counts as a failed attempt (ErrHandlerTimeout, visible in the
	// status), its late Ack or Nack changes nothing, and in the
	// Transactional strategy its transaction is rolled back (its later
	// statements fail). The abandoned handler's goroutine is the caller's:
	// it ends when the handler returns; at most one per timed-out
	// delivery, so at most MaxAttempts per message. A forwarder's sends
	// end with it too.
	HandlerTimeout time.Duration
	// CloseTimeout bounds how long Close, and a lease that ends (rebalance,
	// pause), wait for in-flight messages to be acked or nacked (default
	// 5s); unfinished ones are treated as nacked.
	CloseTimeout time.Duration
	// StartFromNewest makes a new group start after the messages already
	// sequenced instead of at the oldest retained one. Existing cursors
	// never move.
	StartFromNewest bool
	// DisableSequencer stops the subscriber from running a Sequencer of its
	// own. Some process must run one (any number may): run NewSequencer
	// yourself to tune it.
	DisableSequencer bool
	// KeyIsolation, when Enabled, holds a failing message back with the
	// later messages of its key instead of blocking the whole partition
	// (see KeyIsolation).
	KeyIsolation KeyIsolation
	// Advanced holds what few programs need to set.
	Advanced Advanced
}

// Advanced holds the SubscriberConfig settings few programs need; a zero
// field takes its default, which for PollInterval and
// MaxConcurrentPartitions is the value of SubscriberConfig.Tuning's
// profile.
type Advanced struct {
	// PollInterval is the safety-net poll of an idle partition worker
	// (default: the profile's, 1s with adaptive.Default(), 10ms with
	// LowLatency()). A worker is woken by the sequencer's notifications
	// when messages arrive; without one it polls again after this long,
	// doubling the wait after every poll that finds nothing, up to 30
	// seconds, and coming back to it as soon as a poll finds work no
	// notification announced (after which the wait stretches to a second
	// at most, until a notification announces work again). Raise it to
	// cut idle polling; lower it when notifications are off. The
	// profile's busy pace is kept within it.
	PollInterval time.Duration
	// MaxConcurrentPartitions is the bulkhead: how many of this
	// subscriber's partition workers query the database at the same time
	// (default: the profile's, 16 with adaptive.Default()). With the
	// Transactional strategy a worker holds its place for the whole batch,
	// handler included. Give the pool at least this many connections and
	// a few more.
	MaxConcurrentPartitions int
	// SyncCursorCommits makes the Leased strategy commit each cursor move
	// with synchronous_commit on. By default a Leased cursor move commits
	// without waiting for the server's WAL flush: after a crash of the
	// PostgreSQL server, the messages of the last few hundred milliseconds
	// of cursor moves are delivered again, which the Leased strategy's
	// at-least-once delivery allows. The Transactional strategy always
	// commits synchronously.
	SyncCursorCommits bool
}

// DefaultMaxAttempts is the default SubscriberConfig.MaxAttempts.
const DefaultMaxAttempts = 10

// RetryForever is the SubscriberConfig.MaxAttempts that never takes a
// message out of the stream for its failures.
const RetryForever = -1

// DefaultCloseTimeout is the default SubscriberConfig.CloseTimeout.
const DefaultCloseTimeout = 5 * time.Second

// maxMemberIDLen bounds the host:pid that names a Subscriber's leases (a
// random suffix per subscription is added; the lease manager takes 200
// bytes).
const maxMemberIDLen = 100

// setDefaults gives every zero field its default. A default that depends
// on another field follows that field's value, so that setting one field
// never makes the others impossible.
func (c *SubscriberConfig) setDefaults() {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	ttlUnset := c.Tuning.LeaseTTL == 0
	c.Tuning = c.Tuning.WithDefaults()
	if ttlUnset && c.HandlerTimeout > 0 {
		c.Tuning.LeaseTTL = max(c.Tuning.LeaseTTL, c.HandlerTimeout+c.HandlerTimeout/2)
	}
	if c.HandlerTimeout == 0 {
		c.HandlerTimeout = c.Tuning.LeaseTTL / 3 * 2
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.RejectHandler == nil {
		c.RejectHandler = schemaDeadLetters{pool: c.Pool, schema: c.Schema}
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	c.KeyIsolation.setDefaults()
	p := c.profile()
	if c.Advanced.PollInterval == 0 {
		c.Advanced.PollInterval = p.PollInterval
	}
	if c.Advanced.MaxConcurrentPartitions == 0 {
		c.Advanced.MaxConcurrentPartitions = p.MaxConcurrentPartitions
	}
}

// Validate reports the first impossible setting: a *outboxtype.ConfigError, or a
// *outboxtype.NameError for a bad schema or group name.
func (c SubscriberConfig) Validate() error {
	c.setDefaults()
	if err := names.Schema(c.Schema); err != nil {
		return err
	}
	if err := c.Tuning.Validate(); err != nil {
		var ce *outboxtype.ConfigError
		if errors.As(err, &ce) {
			return &outboxtype.ConfigError{Field: "Tuning." + ce.Field, Reason: ce.Reason}
		}
		return err
	}
	switch {
	case c.Pool == nil:
		return &outboxtype.ConfigError{Field: "Pool", Reason: "required"}
	case c.ConsumerGroup == "":
		return &outboxtype.ConfigError{Field: "ConsumerGroup", Reason: "required"}
	case names.Group(c.ConsumerGroup) != nil:
		return names.Group(c.ConsumerGroup) // a *NameError
	case c.Strategy != Leased && c.Strategy != Transactional:
		return &outboxtype.ConfigError{Field: "Strategy", Reason: "must be Leased or Transactional"}
	case c.MaxAttempts < RetryForever:
		return &outboxtype.ConfigError{Field: "MaxAttempts", Reason: "must be positive, or RetryForever (0: DefaultMaxAttempts)"}
	case c.RejectHandler != nil && isNil(c.RejectHandler):
		return &outboxtype.ConfigError{Field: "RejectHandler", Reason: fmt.Sprintf("is a nil %T: give it a handler (e.g. a deadletter.Store from deadletter.New), or leave the field nil for the schema's dead-letter table", c.RejectHandler)}
	case c.HandlerTimeout < 0 || c.HandlerTimeout > c.Tuning.LeaseTTL:
		return &outboxtype.ConfigError{Field: "HandlerTimeout", Reason: fmt.Sprintf("must be positive and at most Tuning.LeaseTTL (%v): raise the lease TTL, or leave it zero to derive it (3/2 of HandlerTimeout)", c.Tuning.LeaseTTL)}
	case c.CloseTimeout < 0:
		return &outboxtype.ConfigError{Field: "CloseTimeout", Reason: "must be positive"}
	case c.Advanced.PollInterval < 0:
		return &outboxtype.ConfigError{Field: "Advanced.PollInterval", Reason: "must be positive (0 for the profile's)"}
	case c.Advanced.MaxConcurrentPartitions < 0:
		return &outboxtype.ConfigError{Field: "Advanced.MaxConcurrentPartitions", Reason: "must be at least 1 (0 for the profile's)"}
	}
	return c.KeyIsolation.Validate()
}

// profile is the tuning profile c.Tuning was made from.
func (c SubscriberConfig) profile() tune.Profile {
	p, _ := tune.Lookup(c.Tuning.ProfileName())
	return p
}

// The conversion to the machinery's configuration, of a config with its
// defaults.

// settings are what the partition workers use: the tuning over its
// profile, with the idle poll of Advanced.
func (c SubscriberConfig) settings() tune.Settings {
	return c.profile().Settings(c.Tuning.BatchSize, c.Tuning.BackoffBase, c.Tuning.BackoffMax, c.Advanced.PollInterval)
}

// renewInterval is how often held leases are renewed: five times per lease
// TTL, so that a lease survives a few slow or failed renewals.
func (c SubscriberConfig) renewInterval() time.Duration { return c.Tuning.LeaseTTL / 5 }

// balanceInterval is how often a member heartbeats and re-evaluates its
// share and the paused partitions, the latency of a rebalance or a pause:
// a second, or a tenth of a shorter lease TTL.
func (c SubscriberConfig) balanceInterval() time.Duration {
	return min(lease.DefaultBalanceInterval, c.Tuning.LeaseTTL/10)
}

// memberID names this process in the leases it takes (host:pid; a random
// suffix per subscription makes each lease manager's own).
func (c SubscriberConfig) memberID() string { return names.Instance(maxMemberIDLen) }

// sequencerConfig is the configuration of the Subscriber's own Sequencer:
// the Subscriber's schema and pool, at its profile's pace.
func (c SubscriberConfig) sequencerConfig() SequencerConfig {
	return SequencerConfig{Schema: c.Schema, Pool: c.Pool, MinPassInterval: c.profile().SequencerInterval}
}
