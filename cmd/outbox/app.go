package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/deadletter"
)

// app is one run of the command: its flags, streams and the pool it opens
// on first use.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string

	databaseURL, schema, output string

	pool *pgxpool.Pool
}

func (a *app) close() {
	if a.pool != nil {
		a.pool.Close()
	}
}

// schemaName is the outbox schema of the run.
func (a *app) schemaName() string {
	if a.schema == "" {
		return outbox.DefaultSchema
	}
	return a.schema
}

// connect opens the pool on first use.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if a.pool != nil {
		return a.pool, nil
	}
	url := a.databaseURL
	if url == "" {
		url = a.getenv("DATABASE_URL")
	}
	if url == "" {
		return nil, usagef("no database: pass --database-url or set DATABASE_URL (e.g. postgres://user@localhost:5432/app)")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, usagef("--database-url: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
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
func (a *app) print(v any, table func(w *tabwriter.Writer)) error {
	if a.output == "json" {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

// confirm asks the user to confirm what (unless yes); a refusal is an
// error.
func (a *app) confirm(yes bool, what string) error {
	if yes {
		return nil
	}
	fmt.Fprintf(a.stderr, "%s\nType yes to go on: ", what)
	line, _ := bufio.NewReader(a.stdin).ReadString('\n')
	if strings.TrimSpace(line) != "yes" {
		return usagef("not confirmed: nothing was changed (pass --yes to skip the question)")
	}
	return nil
}
