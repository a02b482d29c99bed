package lease_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestConfigValidate(t *testing.T) {
	pool := &pgxpool.Pool{} // never used: Validate does not connect
	valid := func() lease.Config {
		return lease.Config{Pool: pool, Group: "billing", Topic: "orders", Partitions: 16}
	}
	tests := []struct {
		name   string
		change func(c *lease.Config)
		field  string // ConfigError.Field; "" for valid
		name2  bool   // expect a *outboxtype.NameError instead
	}{
		{name: "defaults", change: func(c *lease.Config) {}},
		{name: "explicit", change: func(c *lease.Config) {
			c.Schema, c.MemberID, c.TTL, c.RenewInterval, c.BalanceInterval = "s1", "pod-1", 3*time.Second, time.Second, 500*time.Millisecond
		}},
		{name: "max partitions", change: func(c *lease.Config) { c.Partitions = 1024 }},
		{name: "unicode group", change: func(c *lease.Config) { c.Group = "facturación" }},
		{name: "group of 200 bytes", change: func(c *lease.Config) { c.Group = strings.Repeat("g", 200) }},
		{name: "TTL only", change: func(c *lease.Config) { c.TTL = 3 * time.Second }}, // RenewInterval defaults to 1s

		{name: "bad schema", change: func(c *lease.Config) { c.Schema = "Bad-Schema" }, name2: true},
		{name: "no pool", change: func(c *lease.Config) { c.Pool = nil }, field: "Pool"},
		{name: "no group", change: func(c *lease.Config) { c.Group = "" }, field: "Group"},
		{name: "long group", change: func(c *lease.Config) { c.Group = strings.Repeat("g", 201) }, field: "Group"},
		{name: "group not UTF-8", change: func(c *lease.Config) { c.Group = "g\xff" }, field: "Group"},
		{name: "group with NUL", change: func(c *lease.Config) { c.Group = "g\x00" }, field: "Group"},
		{name: "no topic", change: func(c *lease.Config) { c.Topic = "" }, name2: true},
		{name: "bad topic", change: func(c *lease.Config) { c.Topic = "a topic" }, name2: true},
		{name: "no partitions", change: func(c *lease.Config) { c.Partitions = 0 }, field: "Partitions"},
		{name: "too many partitions", change: func(c *lease.Config) { c.Partitions = 1025 }, field: "Partitions"},
		{name: "member with NUL", change: func(c *lease.Config) { c.MemberID = "m\x00" }, field: "MemberID"},
		{name: "long member", change: func(c *lease.Config) { c.MemberID = strings.Repeat("m", 201) }, field: "MemberID"},
		{name: "negative TTL", change: func(c *lease.Config) { c.TTL = -time.Second }, field: "TTL"},
		{name: "tiny TTL", change: func(c *lease.Config) { c.TTL = 50 * time.Millisecond }, field: "TTL"},
		{name: "negative renew", change: func(c *lease.Config) { c.RenewInterval = -time.Second }, field: "RenewInterval"},
		{name: "renew not below TTL", change: func(c *lease.Config) { c.TTL, c.RenewInterval = time.Second, time.Second }, field: "RenewInterval"},
		{name: "negative balance", change: func(c *lease.Config) { c.BalanceInterval = -time.Second }, field: "BalanceInterval"},
		{name: "balance not below TTL", change: func(c *lease.Config) { c.BalanceInterval = lease.DefaultTTL }, field: "BalanceInterval"},
		{name: "fixed balance pace", change: func(c *lease.Config) { c.BalanceInterval, c.MaxBalanceInterval = 2*time.Second, 2*time.Second }},
		{name: "max balance below balance", change: func(c *lease.Config) { c.MaxBalanceInterval = time.Second / 2 }, field: "MaxBalanceInterval"},
		{name: "max balance not below TTL", change: func(c *lease.Config) { c.MaxBalanceInterval = lease.DefaultTTL }, field: "MaxBalanceInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.change(&c)
			err := c.Validate()
			var ce *outboxtype.ConfigError
			var ne *outboxtype.NameError
			switch {
			case tt.field == "" && !tt.name2:
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
			case tt.name2:
				if !errors.As(err, &ne) || !errors.Is(err, sentinel.ErrInvalidName) {
					t.Fatalf("want a *NameError, got %T %v", err, err)
				}
			default:
				if !errors.As(err, &ce) || !errors.Is(err, sentinel.ErrInvalidConfig) {
					t.Fatalf("want a *ConfigError, got %T %v", err, err)
				}
				if ce.Field != tt.field {
					t.Fatalf("want field %s, got %s (%v)", tt.field, ce.Field, err)
				}
			}
			// NewManager validates the same way.
			_, nerr := lease.NewManager(c, nil)
			if (err == nil) != (nerr == nil) {
				t.Fatalf("Validate: %v, NewManager: %v", err, nerr)
			}
		})
	}
}

func TestShare(t *testing.T) {
	// The shares of all live members add up to the active partitions and
	// differ by at most one; lower ids get the larger shares.
	if got := lease.Share(16, "b", []string{"c", "a"}); got != 5 {
		t.Errorf("share of b: %d, want 5", got)
	}
	if got := lease.Share(16, "a", []string{"c", "b"}); got != 6 {
		t.Errorf("share of a: %d, want 6", got)
	}
	for active := 0; active <= 20; active++ {
		for n := 1; n <= 7; n++ {
			var ids []string
			for i := range n {
				ids = append(ids, string(rune('a'+i)))
			}
			sum, lo, hi := 0, active, 0
			for i, me := range ids {
				others := append(append([]string{}, ids[:i]...), ids[i+1:]...)
				s := lease.Share(active, me, others)
				sum += s
				lo, hi = min(lo, s), max(hi, s)
			}
			if sum != active || hi-lo > 1 {
				t.Errorf("active %d, %d members: sum %d, shares %d..%d", active, n, sum, lo, hi)
			}
		}
	}
}
