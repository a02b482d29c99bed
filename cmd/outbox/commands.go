package main

import (
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/termsafe"
	"github.com/millrace/watermill-outbox/retention"
)

func (a *app) migrateCommand() *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox tables",
		Long: `migrate creates the outbox schema and tables, or upgrades them to this release's schema version.
It is idempotent and safe to run from several places at once. --dry-run prints the SQL it would run.
With several sources (--config), it migrates every one (or the one of --source).`,
		Example: `  outbox migrate
  outbox migrate --dry-run
  outbox migrate status`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if a.multiSource() && !dryRun {
				return a.migrateSources(ctx)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			current, err := outbox.CurrentSchemaVersion(ctx, pool, a.schemaName())
			if err != nil {
				return err
			}
			if current > outbox.SchemaVersion {
				return fmt.Errorf("schema %s is at version %d, newer than this release's %d: upgrade the outbox command", a.schemaName(), current, outbox.SchemaVersion)
			}
			if dryRun {
				q := dbsql.For(a.schemaName())
				fmt.Fprintf(a.stdout, "-- schema %s: version %d, this release: %d\n", a.schemaName(), current, outbox.SchemaVersion)
				if current == 0 {
					fmt.Fprintf(a.stdout, "%s;\n%s;\n", q.CatalogCreateSchema, q.CatalogVersionTable)
				}
				for _, m := range dbsql.Migrations[current:] {
					fmt.Fprintf(a.stdout, "\n-- version %d: %s\n%s\n", m.Version, m.Name, dbsql.Render(m.SQL, a.schemaName()))
				}
				return nil
			}
			if err := outbox.Migrate(ctx, pool, a.schemaName()); err != nil {
				return err
			}
			return a.print(map[string]any{"schema": a.schemaName(), "from": current, "to": outbox.SchemaVersion}, func(w *termsafe.Writer) {
				if current == outbox.SchemaVersion {
					w.Printf("schema %s is up to date (version %d)\n", a.schemaName(), current)
				} else {
					w.Printf("schema %s migrated from version %d to %d\n", a.schemaName(), current, outbox.SchemaVersion)
				}
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the SQL instead of running it")
	cmd.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "Show the schema version of the database and of this release",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			current, err := outbox.CurrentSchemaVersion(cmd.Context(), pool, a.schemaName())
			if err != nil {
				return err
			}
			state := "up to date"
			switch {
			case current == 0:
				state = "not migrated: run outbox migrate"
			case current < outbox.SchemaVersion:
				state = "behind: run outbox migrate"
			case current > outbox.SchemaVersion:
				state = "ahead: this release is older than the database"
			}
			return a.print(map[string]any{"schema": a.schemaName(), "database": current, "release": outbox.SchemaVersion, "state": state}, func(w *termsafe.Writer) {
				w.Printf("SCHEMA\tDATABASE\tRELEASE\tSTATE\n%s\t%d\t%d\t%s\n", a.schemaName(), current, outbox.SchemaVersion, state)
			})
		},
	})
	return cmd
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this command and its schema version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			version := "(devel)"
			if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
				version = info.Main.Version
			}
			return a.print(map[string]any{"version": version, "schema_version": outbox.SchemaVersion}, func(w *termsafe.Writer) {
				w.Printf("outbox %s (schema version %d)\n", version, outbox.SchemaVersion)
			})
		},
	}
}

func (a *app) topicsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "topics", Short: "List or register topics", Example: "  outbox topics list\n  outbox topics register orders 16"}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the registered topics",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			rep, err := adm.Status(cmd.Context(), admin.Filter{})
			if err != nil {
				return err
			}
			type topic struct {
				Topic       string `json:"topic"`
				Partitions  int    `json:"partitions"`
				Sequenced   int64  `json:"sequenced"`
				Unsequenced int64  `json:"unsequenced"`
				Groups      int    `json:"groups"`
				// Path: "log" (sequenced into the log, read by any
				// group) or "forwarder-only" (outbox.ForwardOnly).
				Path string `json:"path"`
			}
			out := []topic{}
			for _, t := range rep.Topics {
				out = append(out, topic{t.Topic, t.Partitions, t.Sequenced, t.Unsequenced, len(t.Groups), topicPath(t.ForwardOnly)})
			}
			return a.print(out, func(w *termsafe.Writer) {
				w.Printf("TOPIC\tPARTITIONS\tSEQUENCED\tPENDING\tGROUPS\tPATH\n")
				for _, t := range out {
					w.Printf("%s\t%d\t%d\t%d\t%d\t%s\n", t.Topic, t.Partitions, t.Sequenced, t.Unsequenced, t.Groups, t.Path)
				}
			})
		},
	})
	var forwardOnly bool
	register := &cobra.Command{
		Use:   "register TOPIC PARTITIONS",
		Short: "Register a topic with a partition count (1..1024)",
		Long: `register registers a topic with its partition count, fixed from then on. With --forward-only the topic is
read by one Forwarder and no Subscriber: its messages go from pending to the broker without the log
(outbox.ForwardOnly; docs/forwarder.md, "Forwarder-only topics"), also fixed from then on.`,
		Example: "  outbox topics register orders 16\n  outbox topics register payments.kafka 16 --forward-only",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.Atoi(args[1])
			if err != nil {
				return usagef("PARTITIONS must be a number, got %q", args[1])
			}
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			var opts []outbox.TopicOption
			if forwardOnly {
				opts = append(opts, outbox.ForwardOnly())
			}
			if err := outbox.RegisterTopic(cmd.Context(), pool, a.schemaName(), args[0], n, opts...); err != nil {
				return err
			}
			return a.print(map[string]any{"topic": args[0], "partitions": n, "path": topicPath(forwardOnly)}, func(w *termsafe.Writer) {
				w.Printf("topic %s registered with %d partitions (%s)\n", args[0], n, topicPath(forwardOnly))
			})
		},
	}
	register.Flags().BoolVar(&forwardOnly, "forward-only", false, "read by one Forwarder and no Subscriber: no copy into the log (outbox.ForwardOnly)")
	cmd.AddCommand(register)
	return cmd
}

func (a *app) vacuumCommand() *cobra.Command {
	var keepFor time.Duration
	cmd := &cobra.Command{
		Use:   "vacuum",
		Short: "Run one retention pass: delete log rows every consumer group has finished",
		Long: `vacuum runs one pass of the retention vacuum: it deletes the log rows at or below the lowest cursor of
every consumer group (and, with --keep-for, only those older than that), and names the groups that hold it back.`,
		Example: "  outbox vacuum --keep-for 24h",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			v, err := retention.NewVacuum(retention.Config{Schema: a.schemaName(), Pool: pool, KeepFor: keepFor}, nil)
			if err != nil {
				return err
			}
			defer v.Close()
			stats, err := v.VacuumOnce(cmd.Context())
			if err != nil {
				return err
			}
			return a.print(stats, func(w *termsafe.Writer) {
				w.Printf("deleted %d rows in %d partitions\n", stats.Deleted, stats.Visited)
				for _, h := range stats.HeldBack {
					w.Printf("held back by group %s on %s: %d messages in partitions %v\n", h.Group, h.Topic, h.Messages, h.Partitions)
				}
			})
		},
	}
	cmd.Flags().DurationVar(&keepFor, "keep-for", 0, "keep rows sequenced less than this long ago")
	return cmd
}

// topicPath names the path a topic's messages take.
func topicPath(forwardOnly bool) string {
	if forwardOnly {
		return "forwarder-only"
	}
	return "log"
}
