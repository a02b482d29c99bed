// Command outbox operates a watermill-outbox database: migrate it, see the
// status of every topic, consumer group and partition, pause, resume and
// reset consumer groups, browse and replay dead letters, run the retention
// vacuum, and run a standalone relay (sequencer, and a forwarder to Kafka
// or NATS).
//
//	go install github.com/millrace/watermill-outbox/cmd/outbox@latest
//	export DATABASE_URL=postgres://...
//	outbox status
//	outbox pause --group billing --topic orders
//	outbox dlq list --group billing -o json
//
// Every command takes --database-url (or DATABASE_URL), --schema and
// -o table|json; --help shows examples. Exit codes: 0 success, 1 an error,
// 2 a usage error. Destructive commands ask for confirmation unless --yes.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/millrace/watermill-outbox/internal/termsafe"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// usageError marks an error in the command line (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// execute runs the command line args and returns the exit code.
func execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	app := &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv}
	root := app.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	app.close()
	if err == nil {
		return exitOK
	}
	// Errors quote names and values that came from messages: escaped.
	_, _ = termsafe.Fprintf(stderr, "Error: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) || isFlagError(err) {
		fmt.Fprintln(stderr, "Run 'outbox --help' (or the command with --help) for usage.")
		return exitUsage
	}
	return exitError
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "outbox",
		Short: "Operate a watermill-outbox database",
		Long: `outbox operates a watermill-outbox database on PostgreSQL: migrations, status, consumer groups,
dead letters, retention, and a standalone relay.

The database comes from --database-url or DATABASE_URL (a PostgreSQL connection string);
--schema names the outbox schema (default watermill_outbox).

Several databases (the shards of a sharded application) are sources: --config FILE lists them (and
relay's settings), or --source-env NAME=ENV_VAR names each; their connection strings stay in the
environment and are never printed. status, migrate, relay and serve act on every source; the other
commands on one, named with --source NAME.`,
		Example: `  export DATABASE_URL=postgres://app@localhost:5432/app
  outbox migrate
  outbox status --group billing
  outbox pause --group billing --topic orders --partition 3
  outbox dlq list --group billing -o json
  outbox status --config pipeline.yaml
  outbox pause --config pipeline.yaml --source eu --group billing --topic orders`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&a.databaseURL, "database-url", "", "PostgreSQL connection string (default $DATABASE_URL)")
	root.PersistentFlags().StringVar(&a.schema, "schema", "", "outbox schema (default watermill_outbox)")
	root.PersistentFlags().StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	root.PersistentFlags().StringVar(&a.configPath, "config", "", "YAML file naming several databases (sources) and, for relay, its settings; connection strings come from the environment")
	root.PersistentFlags().StringArrayVar(&a.sourceEnvs, "source-env", nil, "a source as NAME=ENV_VAR, the environment variable holding its connection string (repeatable)")
	root.PersistentFlags().StringVar(&a.sourceName, "source", "", "with several sources: the one a command acts on")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if a.output != "table" && a.output != "json" {
			return usagef("--output must be table or json, got %q", a.output)
		}
		if err := a.loadSources(); err != nil {
			return err
		}
		if s, ok, err := a.selected(); ok && err == nil {
			a.chosen = &s
		}
		return nil
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		a.migrateCommand(), a.versionCommand(), a.topicsCommand(), a.statusCommand(), a.groupsCommand(),
		a.pauseCommand(true), a.pauseCommand(false), a.resetCommand(), a.dlqCommand(), a.heldCommand(), a.vacuumCommand(), a.pipelineCommand(), a.walCommand(), a.serveCommand(),
	)
	return root
}

// isFlagError recognises cobra's errors for unknown commands and bad
// arguments, which it does not type.
func isFlagError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "invalid argument", "flag needs an argument", "required flag"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}
