package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/termsafe"
	"github.com/millrace/watermill-outbox/metrics"
)

// app is one run of the command: its flags, streams and the pool it opens
// on first use.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string

	databaseURL, schema, output string

	// schemaRegistry is --schema-registry (payloads.go).
	schemaRegistry string

	// Several databases (sources.go): --config, --source-env, --source.
	configPath string
	sourceEnvs []string
	sourceName string
	file       fileConfig
	sources    []sourceSpec
	chosen     *sourceSpec // the one source a command acts on, if any

	pool        *pgxpool.Pool
	sourcePools map[string]*pgxpool.Pool  // by source name
	collectors  []metrics.CollectorConfig // relay --metrics-listen: the databases it reads
}

func (a *app) close() {
	if a.pool != nil {
		a.pool.Close()
	}
	for _, p := range a.sourcePools {
		p.Close()
	}
}

// schemaName is the outbox schema of the run: the chosen source's, or
// --schema.
func (a *app) schemaName() string {
	switch {
	case a.chosen != nil:
		return a.chosen.Schema
	case a.schema == "":
		return outbox.DefaultSchema
	}
	return a.schema
}

// connect opens the pool on first use: of the chosen source, or of
// --database-url (DATABASE_URL).
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if a.pool != nil {
		return a.pool, nil
	}
	if _, _, err := a.selected(); err != nil {
		return nil, err
	}
	url := a.databaseURL
	if url == "" {
		url = a.getenv("DATABASE_URL")
	}
	if a.chosen != nil {
		url = a.getenv(a.chosen.DatabaseURLEnv)
	}
	if url == "" {
		return nil, usagef("no database: pass --database-url or set DATABASE_URL (e.g. postgres://user@localhost:5432/app), or configure sources (--config)")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		if a.chosen != nil { // the error may quote the connection string
			return nil, usagef("source %s: $%s is not a PostgreSQL connection string", a.chosen.Name, a.chosen.DatabaseURLEnv)
		}
		return nil, usagef("--database-url: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		if a.chosen != nil {
			return nil, fmt.Errorf("cannot reach the database of source %s: %w", a.chosen.Name, err)
		}
		return nil, fmt.Errorf("cannot reach the database: %w", err)
	}
	a.pool = pool
	return pool, nil
}

func (a *app) admin(ctx context.Context) (*admin.Admin, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	return admin.New(admin.Config{Schema: a.schemaName(), Pool: pool}, nil)
}

func (a *app) deadLetters(ctx context.Context) (*deadletter.Store, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	return deadletter.NewStore(deadletter.Config{Schema: a.schemaName(), Pool: pool}, nil)
}

// print writes v as indented JSON with -o json, or calls table otherwise.
//
// What the outbox shows comes from messages (group names, keys, handler
// errors, payloads), so nothing of it reaches the terminal raw: table gets
// a termsafe.Writer, which escapes every argument it formats (control and
// bidirectional characters become \x1b, \n, \u202e, ...), and has no
// method that does not; the JSON is the same value with those characters
// written as \u escapes.
func (a *app) print(v any, table func(w *termsafe.Writer)) error {
	if a.output == "json" {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return err
		}
		_, err := a.stdout.Write(termsafe.JSON(b.Bytes()))
		return err
	}
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	table(termsafe.NewWriter(w))
	return w.Flush()
}

// note writes a line of text to stderr, every argument escaped.
func (a *app) note(format string, args ...any) {
	_, _ = termsafe.Fprintf(a.stderr, format+"\n", args...)
}

// logger is the log of the long-running commands (relay, serve), on
// stderr: slog's text format, which quotes a value that holds a control or
// bidirectional character with its escapes, so that a logged error or key
// cannot act on the terminal or forge a log line.
func (a *app) logger(debug bool) watermill.LoggerAdapter {
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	return watermill.NewSlogLogger(slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level})))
}

// confirm asks the user to confirm the question format (unless yes), its
// arguments escaped; a refusal is an error (exit 1: the command line was
// right, the answer was no).
func (a *app) confirm(yes bool, format string, args ...any) error {
	if yes {
		return nil
	}
	_, _ = termsafe.Fprintf(a.stderr, format+"\nType yes to go on: ", args...)
	line, _ := bufio.NewReader(a.stdin).ReadString('\n')
	if strings.TrimSpace(line) != "yes" {
		return errors.New("not confirmed: nothing was changed (pass --yes to skip the question)")
	}
	return nil
}
