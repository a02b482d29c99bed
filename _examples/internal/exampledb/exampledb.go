// Package exampledb gives the examples a database with no setup: a
// throwaway PostgreSQL server (removed on exit) with the outbox migrated.
// Without PostgreSQL installed, package pgtemp fetches the server binaries
// once into the user's cache.
package exampledb

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/pgtemp"
)

// DB is a running throwaway database.
type DB struct {
	Pool    *pgxpool.Pool
	cluster *pgtemp.Server
}

// Start starts the server, connects and migrates the outbox schema. It
// uses the PostgreSQL installed, or fetches one (see package pgtemp).
func Start(ctx context.Context) (*DB, error) {
	return start(ctx, pgtemp.Options{})
}

// StartLogical is Start with wal_level = logical, as the log-based mode
// (outbox.ModeWAL and package relay) needs.
func StartLogical(ctx context.Context) (*DB, error) {
	return start(ctx, pgtemp.Options{Settings: map[string]string{"wal_level": "logical"}})
}

func start(ctx context.Context, opts pgtemp.Options) (*DB, error) {
	cluster, err := pgtemp.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	// pgxpool's default (4 connections on a 2-core machine) is too few
	// for a Transactional Subscriber, whose workers hold a connection per
	// batch: it refuses such a pool (docs/postgresql.md, "Pool size").
	pool, err := pgxpool.New(ctx, cluster.URL("postgres")+"&pool_max_conns=24")
	if err != nil {
		cluster.Stop()
		return nil, err
	}
	if err := outbox.Migrate(ctx, pool, outbox.DefaultSchema); err != nil {
		pool.Close()
		cluster.Stop()
		return nil, err
	}
	fmt.Printf("PostgreSQL on 127.0.0.1:%d (throwaway), outbox migrated\n", cluster.Port())
	return &DB{Pool: pool, cluster: cluster}, nil
}

// Stop closes the pool and removes the server.
func (db *DB) Stop() {
	db.Pool.Close()
	db.cluster.Stop()
}

// Logger returns a Watermill logger showing warnings and errors only.
func Logger() watermill.LoggerAdapter {
	return watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// Main runs run and prints its final line: "OK", or the error and exit
// status 1.
func Main(run func(ctx context.Context) error) {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "FAILED:", err)
		os.Exit(1)
	}
	fmt.Println("OK")
}
