package outbox

import (
	"fmt"

	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// KeyIsolation configures key-level isolation of a Subscriber: when a
// message fails, it and every later message with the same partition key
// are held back, while the partition's other keys keep flowing in order.
// Ordering is only promised per key, so only the failing key waits.
//
// The held key is retried with the usual backoff (Tuning.BackoffBase to
// BackoffMax), MaxAttempts and Reject rules; once its first message
// succeeds or is dead-lettered, its held messages are delivered in order,
// before any newer message of the key. Keyless messages are held alone:
// nothing waits behind them. The held-back state is stored in the database
// (table held), so restarts, lease moves and PostgreSQL restarts keep it,
// and admin.Status shows it; admin.Admin.RetryHeldNow and DeadLetterHeld
// act on a held key.
//
// The bound keeps a partition from holding without limit: when holding
// one more key would pass MaxHeldKeys, or one more message would pass
// HeldMessagesPerKey messages per allowed key (10,000 by default), the
// partition blocks on its failing message as it does without isolation,
// logs it, shows it (PartitionStatus.IsolationFullSince) and counts it
// (metric partitions_isolation_full), until held keys drain.
//
// What it costs: nothing while nothing fails; while keys are held, the
// worker reads their rows once a second and writes one row per held
// message. See docs/architecture.md, "Key-level isolation".
type KeyIsolation struct {
	// Enabled turns isolation on (off by default: a failing message then
	// blocks its whole partition until it succeeds or is dead-lettered).
	Enabled bool
	// MaxHeldKeys bounds the keys held per partition (default 100), and
	// with it the messages held: HeldMessagesPerKey per allowed key.
	MaxHeldKeys int
}

// DefaultMaxHeldKeys is the default KeyIsolation.MaxHeldKeys.
const DefaultMaxHeldKeys = 100

// HeldMessagesPerKey is how many messages a partition holds back per key
// KeyIsolation.MaxHeldKeys allows (10,000 with the default bound): the
// bound on its held messages, whichever keys they belong to.
const HeldMessagesPerKey = 100

// maxMaxHeldKeys keeps the bound on held messages within an int32.
const maxMaxHeldKeys = 1 << 31 / HeldMessagesPerKey

func (k *KeyIsolation) setDefaults() {
	if k.MaxHeldKeys == 0 {
		k.MaxHeldKeys = DefaultMaxHeldKeys
	}
}

// Validate reports an impossible setting.
func (k KeyIsolation) Validate() error {
	k.setDefaults()
	if k.MaxHeldKeys < 1 || k.MaxHeldKeys > maxMaxHeldKeys {
		return &outboxtype.ConfigError{Field: "KeyIsolation.MaxHeldKeys", Reason: fmt.Sprintf("must be 1..%d (0 for the default, %d)", maxMaxHeldKeys, DefaultMaxHeldKeys)}
	}
	return nil
}

func (k KeyIsolation) delivery() consumer.Isolation {
	k.setDefaults()
	return consumer.Isolation{Enabled: k.Enabled, MaxHeldKeys: k.MaxHeldKeys, MaxHeldMessages: k.MaxHeldKeys * HeldMessagesPerKey}
}

// NotKeySpecific marks err, returned by a BatchHandler, as a failure that is
// not the failing message's own (a broker or a database that is down): with
// KeyIsolation, the partition then blocks and backs off as it would without
// isolation, instead of holding the message's key back — every other key
// would fail the same way, and hold-back is meant for one bad key. Without
// isolation it changes nothing. errors.Is(err, ErrNotKeySpecific) reports
// it; the forwarder marks its broker errors so. A nil err stays nil.
func NotKeySpecific(err error) error {
	if err == nil {
		return nil
	}
	return &errs.NotKeySpecificError{Cause: err}
}
