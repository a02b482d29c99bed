package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.yaml.in/yaml/v3"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/termsafe"
)

// Several databases (sources): a sharded application's outbox databases,
// configured in a file (--config) or with --source-env, each with its
// connection string in an environment variable of its own: a file or a
// command line is read by more people and tools than the environment, and
// the connection strings hold passwords. They are never printed.
//
//	# pipeline.yaml
//	sources:
//	  - name: eu
//	    database_url_env: OUTBOX_EU_DATABASE_URL
//	  - name: us
//	    database_url_env: OUTBOX_US_DATABASE_URL
//	    schema: shop_outbox
//	pipeline:         # outbox pipeline's flags, overridden by the command line
//	  topics: [orders]
//	  kafka: [broker1:9092]
//	schema_registry: http://registry:8081   # --schema-registry
//
// Commands that act on one database take --source NAME (or need none when
// one source is configured); status, migrate, pipeline and serve act on every
// source.

// sourceSpec is one configured source.
type sourceSpec struct {
	Name           string `yaml:"name" json:"name"`
	DatabaseURLEnv string `yaml:"database_url_env" json:"-"`
	Schema         string `yaml:"schema" json:"schema"`
}

// fileConfig is the --config file.
type fileConfig struct {
	Sources  []sourceSpec `yaml:"sources"`
	Pipeline pipelineFile `yaml:"pipeline"`
	// SchemaRegistry is the schema registry's URL, for --schema-registry
	// (payloads.go).
	SchemaRegistry string `yaml:"schema_registry"`
}

// pipelineFile holds outbox pipeline's settings in the --config file.
type pipelineFile struct {
	Topics      []string `yaml:"topics"`
	Kafka       []string `yaml:"kafka"`
	NATS        string   `yaml:"nats"`
	Group       string   `yaml:"group"`
	AtLeastOnce bool     `yaml:"at_least_once"`
}

// maxConfigBytes is the largest --config file read: a config lists
// sources and topics, a few kilobytes; anything near this is a wrong path
// (a log, a dump), refused before it is read whole.
const maxConfigBytes = 1 << 20

// readConfigFile reads the --config file, refusing one larger than
// maxConfigBytes without reading more of it.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usagef("--config: %v", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, usagef("--config %s: %v", path, err)
	}
	if len(data) > maxConfigBytes {
		return nil, usagef("--config %s: larger than %d KiB: a config file lists sources and a pipeline in a few kilobytes; is it the right file?", path, maxConfigBytes>>10)
	}
	return data, nil
}

// loadSources reads --config and --source-env into a.sources and
// a.file, and checks them and --source: called before every command.
func (a *app) loadSources() error {
	if a.configPath != "" {
		data, err := readConfigFile(a.configPath)
		if err != nil {
			return err
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true) // a misspelt key (or a database_url written in the file) is an error, not ignored
		if err := dec.Decode(&a.file); err != nil && !errors.Is(err, io.EOF) {
			return usagef("--config %s: %v", a.configPath, err)
		}
		a.sources = append(a.sources, a.file.Sources...)
	}
	for _, f := range a.sourceEnvs {
		name, env, ok := strings.Cut(f, "=")
		if !ok || env == "" {
			return usagef("--source-env %q: want NAME=ENV_VAR, the environment variable that holds the source's connection string", f)
		}
		a.sources = append(a.sources, sourceSpec{Name: name, DatabaseURLEnv: env})
	}
	seen := map[string]bool{}
	for i, s := range a.sources {
		if err := names.Source(s.Name); err != nil {
			return usagef("source %d: %v", i+1, err)
		}
		if seen[s.Name] {
			return usagef("source %s is configured twice", s.Name)
		}
		seen[s.Name] = true
		if s.DatabaseURLEnv == "" {
			return usagef("source %s: no database_url_env: name the environment variable that holds its connection string", s.Name)
		}
		if a.getenv(s.DatabaseURLEnv) == "" {
			return usagef("source %s: $%s is empty: set it to the source's connection string", s.Name, s.DatabaseURLEnv)
		}
		if s.Schema == "" {
			a.sources[i].Schema = a.schemaName()
		} else if err := names.Schema(s.Schema); err != nil {
			return usagef("source %s: %v", s.Name, err)
		}
	}
	if len(a.sources) > 0 && a.databaseURL != "" {
		return usagef("--database-url and sources (--config, --source-env) exclude each other: name the database as a source")
	}
	if a.sourceName != "" {
		if len(a.sources) == 0 {
			return usagef("--source %s: no sources configured (--config FILE or --source-env NAME=ENV_VAR)", a.sourceName)
		}
		if _, ok := a.source(a.sourceName); !ok {
			return usagef("--source %s: not one of the configured sources (%s)", a.sourceName, strings.Join(a.sourceNames(), ", "))
		}
	}
	return nil
}

func (a *app) source(name string) (sourceSpec, bool) {
	i := slices.IndexFunc(a.sources, func(s sourceSpec) bool { return s.Name == name })
	if i < 0 {
		return sourceSpec{}, false
	}
	return a.sources[i], true
}

func (a *app) sourceNames() []string {
	out := make([]string, len(a.sources))
	for i, s := range a.sources {
		out[i] = s.Name
	}
	return out
}

// multiSource reports whether the command acts on every configured source:
// more than one, and no --source.
func (a *app) multiSource() bool { return len(a.sources) > 1 && a.sourceName == "" }

// selected is the one source a single-database command acts on (ok false
// without sources); with several and no --source, a usage error.
func (a *app) selected() (sourceSpec, bool, error) {
	switch {
	case len(a.sources) == 0:
		return sourceSpec{}, false, nil
	case a.sourceName != "":
		s, _ := a.source(a.sourceName)
		return s, true, nil
	case len(a.sources) == 1:
		return a.sources[0], true, nil
	}
	return sourceSpec{}, false, usagef("%d sources are configured (%s): this command acts on one, name it with --source NAME", len(a.sources), strings.Join(a.sourceNames(), ", "))
}

// openSource opens a pool on s's database on first use, without waiting
// for it to answer (a relay starts while a source is down), and returns
// it again after (status --watch asks every interval). Its connection
// string is never part of an error: it may hold a password.
func (a *app) openSource(ctx context.Context, s sourceSpec) (*pgxpool.Pool, error) {
	if p := a.sourcePools[s.Name]; p != nil {
		return p, nil
	}
	cfg, err := pgxpool.ParseConfig(a.getenv(s.DatabaseURLEnv))
	if err != nil {
		return nil, usagef("source %s: $%s is not a PostgreSQL connection string (postgres://user@host:5432/db or key=value pairs)", s.Name, s.DatabaseURLEnv)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", s.Name, err)
	}
	if a.sourcePools == nil {
		a.sourcePools = map[string]*pgxpool.Pool{}
	}
	a.sourcePools[s.Name] = pool
	return pool, nil
}

// sourceRow is one source in the output of a command over every source.
type sourceRow struct {
	Name   string `json:"name"`
	Schema string `json:"schema"`
	// Error is why the source could not be read ("" when it was).
	Error string `json:"error,omitempty"`
}

// eachSource calls fn for every configured source with a pool on it (in
// parallel), and returns each source's error ("" when fn succeeded).
func (a *app) eachSource(ctx context.Context, fn func(ctx context.Context, s sourceSpec, pool *pgxpool.Pool) error) []sourceRow {
	rows := make([]sourceRow, len(a.sources))
	done := make(chan struct{})
	for i, s := range a.sources {
		rows[i] = sourceRow{Name: s.Name, Schema: s.Schema}
		pool, err := a.openSource(ctx, s)
		go func() {
			defer func() { done <- struct{}{} }()
			if err == nil {
				err = fn(ctx, s, pool)
			}
			if err != nil {
				rows[i].Error = err.Error()
			}
		}()
	}
	for range a.sources {
		<-done
	}
	return rows
}

// unreachable is the error a command over every source returns, after its
// output, when some could not be read: scripts see a non-zero exit.
func unreachable(rows []sourceRow) error {
	var bad []string
	for _, r := range rows {
		if r.Error != "" {
			bad = append(bad, r.Name)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d sources failed: %s", len(bad), len(rows), strings.Join(bad, ", "))
}

// migrateSources migrates every source's schema.
func (a *app) migrateSources(ctx context.Context) error {
	type migrated struct {
		sourceRow
		From int `json:"from"`
		To   int `json:"to"`
	}
	from := make([]int, len(a.sources))
	rows := a.eachSource(ctx, func(ctx context.Context, s sourceSpec, pool *pgxpool.Pool) error {
		i := slices.IndexFunc(a.sources, func(o sourceSpec) bool { return o.Name == s.Name })
		v, err := outbox.CurrentSchemaVersion(ctx, pool, s.Schema)
		if err != nil {
			return err
		}
		from[i] = v
		return outbox.Migrate(ctx, pool, s.Schema)
	})
	out := make([]migrated, len(rows))
	for i, r := range rows {
		out[i] = migrated{r, from[i], outbox.SchemaVersion}
	}
	if err := a.print(out, func(w *termsafe.Writer) {
		w.Printf("SOURCE\tSCHEMA\tFROM\tTO\tSTATE\n")
		for _, m := range out {
			state := "migrated"
			switch {
			case m.Error != "":
				state = "FAILED: " + m.Error
			case m.From == m.To:
				state = "up to date"
			}
			w.Printf("%s\t%s\t%d\t%d\t%s\n", m.Name, m.Schema, m.From, m.To, state)
		}
	}); err != nil {
		return err
	}
	return unreachable(rows)
}

// sourceStatus is one source in outbox status over every source.
type sourceStatus struct {
	sourceRow
	admin.Summary
}

// sourcesReport is outbox status over every source: each side by side,
// and the total of those that could be read.
type sourcesReport struct {
	Sources []sourceStatus `json:"sources"`
	Total   admin.Summary  `json:"total"`
	// Unreachable counts the sources that could not be read: the total
	// leaves them out.
	Unreachable int `json:"unreachable"`
}

// statusSources reads every source's status, filtered by f.
func (a *app) statusSources(ctx context.Context, f admin.Filter) (sourcesReport, error) {
	sums := make([]admin.Summary, len(a.sources))
	rows := a.eachSource(ctx, func(ctx context.Context, s sourceSpec, pool *pgxpool.Pool) error {
		adm, err := admin.New(admin.Config{Schema: s.Schema, Pool: pool}, nil)
		if err != nil {
			return err
		}
		rep, err := adm.Status(ctx, f)
		if err != nil {
			return err
		}
		sums[slices.IndexFunc(a.sources, func(o sourceSpec) bool { return o.Name == s.Name })] = rep.Summary()
		return nil
	})
	var rep sourcesReport
	for i, r := range rows {
		rep.Sources = append(rep.Sources, sourceStatus{r, sums[i]})
		if r.Error != "" {
			rep.Unreachable++
			continue
		}
		rep.Total = rep.Total.Plus(sums[i])
	}
	return rep, unreachable(rows)
}

// sourcesTable prints rep, one line per source and the total.
func sourcesTable(w *termsafe.Writer, rep sourcesReport) {
	w.Printf("SOURCE\tSCHEMA\tTOPICS\tPARTITIONS\tPENDING\tLAG\tMAX_LAG_S\tLEASED\tPAUSED\tFAILING\tBACKING_OFF\tDEAD_LETTERS\n")
	line := func(name, schema string, s admin.Summary) {
		w.Printf("%s\t%s\t%d\t%d\t%d\t%d\t%.1f\t%d\t%d\t%d\t%d\t%d\n", name, schema, s.Topics, s.Partitions, s.Pending, s.Lag,
			s.MaxLagSeconds, s.Leased, s.Paused, s.Failing, s.BackingOff, s.DeadLetters)
	}
	for _, s := range rep.Sources {
		if s.Error != "" {
			// Every column, so that the rows after it stay aligned (a
			// tabwriter column ends at a line without it); the error
			// follows the table.
			w.Printf("%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\n", s.Name, s.Schema)
			continue
		}
		line(s.Name, s.Schema, s.Summary)
	}
	total := "TOTAL"
	if rep.Unreachable > 0 {
		total = fmt.Sprintf("TOTAL of %d (%d unreachable, not counted)", len(rep.Sources)-rep.Unreachable, rep.Unreachable)
	}
	line(total, "", rep.Total)
	for _, s := range rep.Sources {
		if s.Error != "" {
			w.Printf("%s: UNREACHABLE: %s\n", s.Name, s.Error)
		}
	}
}
