package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/pgcluster"
)

// demo is the state shared by the stages.
type demo struct {
	cfg    config
	out    io.Writer
	logger watermill.LoggerAdapter

	cluster   *pgcluster.Cluster
	pool      *pgxpool.Pool
	sequencer *outbox.Sequencer
	seqDone   chan struct{} // closed when Sequencer.Run returns

	published  publishResult
	log        []logRow
	violations violations
}

func newDemo(cfg config, out io.Writer) *demo {
	// Only warnings and errors: the sequencer logs its retries there.
	handler := slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	return &demo{cfg: cfg, out: out, logger: watermill.NewSlogLogger(slog.New(handler))}
}

// startDatabase starts a throwaway PostgreSQL server and connects to it.
func (d *demo) startDatabase(ctx context.Context) error {
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		return err
	}
	d.cluster = cluster
	poolCfg, err := pgxpool.ParseConfig(cluster.URL("postgres"))
	if err != nil {
		return err
	}
	// One connection per publisher, plus the sequencer's two (its passes and
	// its LISTEN) and a few for progress and verification.
	poolCfg.MaxConns = int32(d.cfg.publishers + 4)
	if d.pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err != nil {
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

// startSequencer runs a Sequencer in the background until close.
func (d *demo) startSequencer() error {
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Pool: d.pool}, d.logger)
	if err != nil {
		return err
	}
	d.sequencer = seq
	d.seqDone = make(chan struct{})
	go func() {
		defer close(d.seqDone)
		// Run returns nil when stopped; database errors are logged and retried.
		_ = seq.Run(context.Background())
	}()
	return nil
}

// closeClients stops the sequencer and closes the pool.
func (d *demo) closeClients() {
	if d.sequencer != nil {
		_ = d.sequencer.Close()
		<-d.seqDone
		d.sequencer = nil
	}
	if d.pool != nil {
		d.pool.Close()
		d.pool = nil
	}
}

// close stops everything the demo started.
func (d *demo) close() {
	d.closeClients()
	if d.cluster != nil {
		d.cluster.Stop()
		d.cluster = nil
	}
}

// awaitSignalExit is called after an interrupt. Once the server runs,
// pgcluster's own signal handler stops it and exits the process (status
// 130) when it is gone. Stop from here would return at once while the
// handler is at work, and exiting then would leave the server's directory
// behind, so give the handler time; the deferred close is the fallback
// should the signal have come before the handler was installed.
func (d *demo) awaitSignalExit() {
	d.closeClients()
	if d.cluster != nil {
		time.Sleep(20 * time.Second)
	}
}
