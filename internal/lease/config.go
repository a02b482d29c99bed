package lease

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/partitioning"
)

const (
	maxLabelLen = 200 // bytes of Config.Group and Config.MemberID
	minTTL      = 100 * time.Millisecond
)

// Defaults of Config.
const (
	DefaultTTL             = 10 * time.Second // Config.TTL
	DefaultBalanceInterval = time.Second      // Config.BalanceInterval
)

// Config configures a Manager.
type Config struct {
	// Schema is the outbox schema (default "watermill_outbox").
	Schema string
	// Pool is the connection pool the manager works through. Required
	// unless Store is set.
	Pool *pgxpool.Pool
	// Store is the database the manager works on (default: NewPGStore on
	// Pool and Relaxed); the simulator sets a model.
	Store Store
	// Group is the consumer group: 1 to 200 bytes of valid UTF-8 without
	// NUL. Required.
	Group string
	// Topic is the topic whose partitions are leased. Required.
	Topic string
	// Partitions is the topic's partition count (1..1024). Required.
	Partitions int
	// MemberID identifies this member of the group (default: a random
	// unique id). Two running managers must never share one.
	MemberID string
	// TTL is how long a lease, and a member's heartbeat, stay valid without
	// renewal (default 10s, at least 100ms).
	TTL time.Duration
	// RenewInterval is how often held leases are renewed (default TTL/3).
	// Must be < TTL.
	RenewInterval time.Duration
	// BalanceInterval is how often the member heartbeats and re-evaluates
	// membership, its share, paused partitions and free leases while the
	// group changes (default 1s). Must be < TTL.
	BalanceInterval time.Duration
	// MaxBalanceInterval is how long the wait between balances grows to,
	// doubling from BalanceInterval, while the group is settled (this
	// member holds its share, nothing drains, nobody joined or left) and
	// the group's changes are announced (Listen's subscription is live):
	// a join, a leave, a pause, a resume or a reset is then heard at once,
	// and a crashed member's expiry is looked at when it falls due
	// (Balance.OthersExpireIn). Default TTL/3; at least BalanceInterval
	// and < TTL. Set it to BalanceInterval to balance at a fixed pace.
	MaxBalanceInterval time.Duration
	// Listen subscribes fn to the notifications of the group's changes on
	// channel (names.MembersChannel) for Run's loop. Default: the shared
	// LISTEN connection of Pool (internal/notifier); without Pool, none,
	// and the manager balances every BalanceInterval.
	Listen func(channel string, fn func(payload string)) Listening
	// StartFromNewest makes a new group's cursors start at the partition's
	// current last seq, skipping the existing messages, instead of at 0.
	// Existing cursors never move.
	StartFromNewest bool
	// Relaxed runs the cursor moves that commit without waiting for their
	// WAL flush (Lease.AdvanceRelaxed), when set: the Subscriber gives the
	// pgcombine.Combiner its partitions' counted reads go through, so that
	// workers woken together share round trips. Default: Pool.
	Relaxed pgexec.Querier
}

func (c *Config) setDefaults() {
	if c.Schema == "" {
		c.Schema = names.DefaultSchema
	}
	if c.MemberID == "" {
		c.MemberID = watermill.NewShortUUID()
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 3
	}
	if c.BalanceInterval == 0 {
		c.BalanceInterval = DefaultBalanceInterval
	}
	if c.MaxBalanceInterval == 0 {
		c.MaxBalanceInterval = max(c.TTL/3, c.BalanceInterval)
	}
}

// Listening is a subscription Config.Listen made (a
// *notifier.Subscription by default).
type Listening interface {
	// Live reports whether a notification sent now would reach the
	// subscription's callback: the manager stretches its balances only
	// while it does.
	Live() bool
	// Unlisten ends the subscription.
	Unlisten()
}

// Validate reports the first impossible setting as a *outboxtype.ConfigError
// (outboxtype.ConfigError), or a *outboxtype.NameError for a bad schema or topic.
func (c Config) Validate() error {
	c.setDefaults()
	if err := names.Schema(c.Schema); err != nil {
		return err
	}
	if c.Pool == nil && c.Store == nil {
		return &outboxtype.ConfigError{Field: "Pool", Reason: "required"}
	}
	if err := validLabel(c.Group, maxLabelLen); err != nil {
		return &outboxtype.ConfigError{Field: "Group", Reason: err.Error()}
	}
	if err := names.Topic(c.Topic); err != nil {
		return err
	}
	if c.Partitions < 1 || c.Partitions > partitioning.MaxPartitions {
		return &outboxtype.ConfigError{Field: "Partitions", Reason: fmt.Sprintf("%d is outside 1..%d", c.Partitions, partitioning.MaxPartitions)}
	}
	if err := validLabel(c.MemberID, maxLabelLen); err != nil {
		return &outboxtype.ConfigError{Field: "MemberID", Reason: err.Error()}
	}
	switch {
	case c.TTL < minTTL:
		return &outboxtype.ConfigError{Field: "TTL", Reason: fmt.Sprintf("must be at least %v, got %v", minTTL, c.TTL)}
	case c.RenewInterval <= 0:
		return &outboxtype.ConfigError{Field: "RenewInterval", Reason: fmt.Sprintf("must be positive, got %v", c.RenewInterval)}
	case c.RenewInterval >= c.TTL:
		return &outboxtype.ConfigError{Field: "RenewInterval", Reason: fmt.Sprintf("must be < TTL (%v), got %v", c.TTL, c.RenewInterval)}
	case c.BalanceInterval <= 0:
		return &outboxtype.ConfigError{Field: "BalanceInterval", Reason: fmt.Sprintf("must be positive, got %v", c.BalanceInterval)}
	case c.BalanceInterval >= c.TTL:
		return &outboxtype.ConfigError{Field: "BalanceInterval", Reason: fmt.Sprintf("must be < TTL (%v), got %v", c.TTL, c.BalanceInterval)}
	case c.MaxBalanceInterval < c.BalanceInterval:
		return &outboxtype.ConfigError{Field: "MaxBalanceInterval", Reason: fmt.Sprintf("must be at least BalanceInterval (%v), got %v", c.BalanceInterval, c.MaxBalanceInterval)}
	case c.MaxBalanceInterval >= c.TTL:
		return &outboxtype.ConfigError{Field: "MaxBalanceInterval", Reason: fmt.Sprintf("must be < TTL (%v), got %v", c.TTL, c.MaxBalanceInterval)}
	}
	return nil
}

func validLabel(s string, maxLen int) error {
	switch {
	case s == "":
		return fmt.Errorf("required")
	case len(s) > maxLen:
		return fmt.Errorf("longer than %d bytes", maxLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("contains a NUL byte")
	}
	return nil
}
