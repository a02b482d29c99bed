package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/relay"
)

// A server without wal_level = logical, a role without the replication
// privilege and a missing slot each get their typed error, saying what to
// change, from CreateSlot and from Run.
func TestPrerequisitesGetTypedErrors(t *testing.T) {
	b := outboxtest.Setup(t)
	ctx := outboxtest.Ctx(t)

	// A missing slot.
	r, err := relay.New(relay.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, outbox.ErrNoSlot) || !strings.Contains(err.Error(), "CreateSlot") {
		t.Fatalf("Run without a slot: %v, want ErrNoSlot naming CreateSlot", err)
	}

	// A role without REPLICATION.
	role := "norepl_" + b.Schema
	b.Exec("CREATE ROLE " + role + " LOGIN")
	b.Exec("GRANT USAGE ON SCHEMA " + b.Schema + " TO " + role)
	t.Cleanup(func() {
		_, _ = b.Pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = b.Pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	cfg := b.Pool.Config().Copy()
	cfg.ConnConfig.User = role
	weak, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer weak.Close()
	if err := relay.CreateSlot(ctx, weak, b.Schema); !errors.Is(err, relay.ErrReplicationPrivilege) || !strings.Contains(err.Error(), "ALTER ROLE") {
		t.Fatalf("CreateSlot as a role without REPLICATION: %v, want ErrReplicationPrivilege", err)
	}

	// A server with wal_level = replica (its default).
	plain, _ := outboxtest.OwnCluster(t, nil, "plain")
	if err := relay.CreateSlot(ctx, plain.Pool, "plain"); !errors.Is(err, outbox.ErrWALLevel) || !strings.Contains(err.Error(), "wal_level = logical") {
		t.Fatalf("CreateSlot with wal_level = replica: %v, want ErrWALLevel", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  relay.Config
		want error
	}{
		{relay.Config{}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, Schema: "Bad-Name"}, outbox.ErrInvalidName},
		{relay.Config{Pool: &pgxpool.Pool{}, MaxBatch: -1}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, StandbyRetry: -time.Second}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, Instance: strings.Repeat("x", relay.MaxInstanceLen+1)}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, Instance: "relay\x1b[2J"}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, Instance: "réplica"}, outbox.ErrInvalidConfig},
		{relay.Config{Pool: &pgxpool.Pool{}, Instance: strings.Repeat("x", relay.MaxInstanceLen)}, nil},
		{relay.Config{Pool: &pgxpool.Pool{}}, nil},
	} {
		if err := tc.cfg.Validate(); !errors.Is(err, tc.want) && !(err == nil && tc.want == nil) {
			t.Errorf("%+v: %v, want %v", tc.cfg, err, tc.want)
		}
	}
	if _, err := outbox.NewPublisher(outbox.PublisherConfig{Mode: 7}, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("Publisher Mode 7: %v, want ErrInvalidConfig", err)
	}
}
