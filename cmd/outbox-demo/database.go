package main

import (
	"context"
	"fmt"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/pgtemp"
)

// startDatabase starts a throwaway PostgreSQL server and connects to it.
// Without PostgreSQL installed, pgtemp fetches the server binaries once
// into the user's cache, saying so in one line.
func (d *demo) startDatabase(ctx context.Context) error {
	cluster, err := pgtemp.Start(ctx, pgtemp.Options{})
	if err != nil {
		return err
	}
	d.cluster = cluster
	// One connection per publisher, plus the sequencer's two (its passes and
	// its LISTEN) and a few for the checks. The forwarders have pools of
	// their own, as they would in a process of their own.
	if d.pool, err = d.connect(ctx, int32(d.cfg.publishers+4)); err != nil {
		return err
	}
	var version string
	if err := d.pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "   PostgreSQL %s on 127.0.0.1:%d (throwaway: removed on exit)\n", version, cluster.Port())
	return nil
}

// setUp migrates the outbox, registers the topic and creates the orders.
func (d *demo) setUp(ctx context.Context) error {
	if err := outbox.Migrate(ctx, d.pool, outbox.DefaultSchema); err != nil {
		return err
	}
	if err := outbox.RegisterTopic(ctx, d.pool, outbox.DefaultSchema, topic, d.cfg.partitions); err != nil {
		return err
	}
	// The aggregates: each transaction bumps one order's version and
	// publishes what happened to it.
	_, err := d.pool.Exec(ctx, `CREATE TABLE orders (
		id         integer     PRIMARY KEY,
		version    bigint      NOT NULL DEFAULT 0,
		updated_at timestamptz
	)`)
	if err != nil {
		return err
	}
	if _, err := d.pool.Exec(ctx, "INSERT INTO orders (id) SELECT generate_series(1, $1::int)", d.cfg.keys); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "   schema %q migrated (version %d), topic %q with %d partitions, table orders with %d rows\n",
		outbox.DefaultSchema, outbox.SchemaVersion, topic, d.cfg.partitions, d.cfg.keys)
	return nil
}
