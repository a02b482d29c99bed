package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/spf13/cobra"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/metrics"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/pipeline"
	"github.com/millrace/watermill-outbox/relay"
	"github.com/millrace/watermill-outbox/retention"
)

func (a *app) pipelineCommand() *cobra.Command {
	var (
		kafkaBrokers  []string
		natsURL       string
		topics        []string
		group         string
		maxAttempts   int
		verbose       bool
		atLeastOnce   bool
		wal           bool
		takeover      time.Duration
		instance      string
		keepFor       time.Duration
		noRetention   bool
		metricsListen string
	)
	cmd := &cobra.Command{
		Use:   "pipeline",
		Short: "Run a sequencer, retention, and a forwarder to Kafka or NATS JetStream (a pipeline)",
		Long: `pipeline runs until interrupted (SIGTERM or Ctrl-C; sends in flight finish first): the schema's pipeline
(package pipeline), that is a sequencer (give committed messages their seq), with --wal the relay of the log-based
mode (messages published in ModeWAL, read from the schema's slot), a retention vacuum (consumed log rows deleted once
every group is past them, or after --keep-for; dealt-with dead letters after a week; --no-retention for none) and,
with --topic and --kafka or --nats, a forwarder of those topics to the broker, as consumer group --group. A message the
broker refuses for good goes to the dead-letter store at once; failed sends (the broker down) are retried until it is
back, unless --max-attempts says how many. Run as many pipelines as you like: they share the work.

Kafka is written exactly once (Kafka transactions; consumers must read read_committed) unless --at-least-once.

With several sources (--config pipeline.yaml, or --source-env NAME=ENV_VAR for each), it runs a pipeline per
source database (package pipeline's Fleet): every message forwarded carries header outbox_source, a source whose
database is down is retried on its own while the others go on, and --metrics-listen exports outbox_source_up per
source. Settings under pipeline: in the file (topics, kafka, nats, group, at_least_once) apply unless a flag is given.`,
		Example: `  outbox pipeline
  outbox pipeline --topic orders --topic invoices --kafka broker1:9092,broker2:9092
  outbox pipeline --topic orders --nats nats://localhost:4222
  outbox pipeline --wal --takeover-timeout 10s --topic orders --kafka broker1:9092
  outbox pipeline --wal --instance relay-a
  outbox pipeline --config pipeline.yaml --metrics-listen 127.0.0.1:9464`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			a.pipelineFromFile(cmd, &topics, &kafkaBrokers, &natsURL, &group, &atLeastOnce)
			if (len(kafkaBrokers) > 0) == (natsURL != "") && len(topics) > 0 {
				return usagef("forwarding --topic needs exactly one of --kafka and --nats")
			}
			if len(topics) == 0 && (len(kafkaBrokers) > 0 || natsURL != "") {
				return usagef("--kafka and --nats need at least one --topic to forward")
			}
			if atLeastOnce && len(kafkaBrokers) == 0 {
				return usagef("--at-least-once applies to --kafka only")
			}
			if cmd.Flags().Changed("takeover-timeout") && !wal {
				return usagef("--takeover-timeout applies to --wal only")
			}
			if cmd.Flags().Changed("instance") && !wal {
				return usagef("--instance applies to --wal only")
			}
			logger := a.logger(verbose) // escapes what it logs
			cfg := pipeline.Config{DisableRetention: noRetention, Retention: retention.Config{KeepFor: keepFor}}
			if wal {
				cfg.WAL = &relay.Config{TakeoverTimeout: takeover, Instance: instance}
			}
			if len(topics) > 0 {
				var target forwarder.Target
				if len(kafkaBrokers) > 0 {
					t, err := kafka.NewTarget(kafka.Config{Brokers: kafkaBrokers, AtLeastOnce: atLeastOnce}, logger)
					if err != nil {
						return err
					}
					defer t.Close()
					target = t
				} else {
					t, err := jetstream.NewTarget(jetstream.Config{URL: natsURL}, logger)
					if err != nil {
						return err
					}
					defer t.Close()
					target = t
				}
				cfg.Forward = forwarder.Config{
					Subscriber: outbox.SubscriberConfig{ConsumerGroup: group, MaxAttempts: maxAttempts},
					Topics:     topics,
					Target:     target,
				}
			}
			var run func(context.Context) error
			var err error
			if len(a.sources) > 0 && (a.multiSource() || a.sourceName == "") {
				run, err = a.pipelineSources(ctx, cfg, logger)
			} else {
				run, err = a.pipelineOne(ctx, cfg, logger)
			}
			var bad *outboxtype.ConfigError
			switch {
			case errors.As(err, &bad) && strings.HasSuffix(bad.Field, "WAL.TakeoverTimeout"):
				return usagef("--takeover-timeout %s %s", takeover, bad.Reason)
			case errors.As(err, &bad) && strings.HasSuffix(bad.Field, "WAL.Instance"):
				return usagef("--instance: %s", bad.Reason)
			case errors.As(err, &bad) && strings.HasSuffix(bad.Field, "Retention.KeepFor"):
				return usagef("--keep-for %s: %s", keepFor, bad.Reason)
			case err != nil:
				return err
			}
			if metricsListen != "" {
				stop, err := a.serveMetrics(metricsListen)
				if err != nil {
					return err
				}
				defer stop()
			}
			mode := "sequencer"
			if wal {
				name := instance
				if name == "" {
					name = relay.DefaultInstance()
				}
				mode = "sequencer, WAL relay of slot " + relay.Slot(a.schemaName()) + " as instance " + name
			}
			where := "schema " + a.schemaName()
			if len(a.sources) > 0 && (a.multiSource() || a.sourceName == "") {
				where = fmt.Sprintf("%d sources (%s)", len(a.sources), strings.Join(a.sourceNames(), ", "))
			}
			a.note("pipeline running on %s (%s%s%s); interrupt to stop", where, mode, forwarding(topics, kafkaBrokers, natsURL), retaining(noRetention, keepFor))
			err = run(ctx)
			if errors.Is(err, ctx.Err()) {
				err = nil
			}
			return err
		},
	}
	cmd.Flags().StringSliceVar(&topics, "topic", nil, "outbox topics to forward (repeat or comma-separate)")
	cmd.Flags().StringSliceVar(&kafkaBrokers, "kafka", nil, "Kafka brokers to forward to")
	cmd.Flags().StringVar(&natsURL, "nats", "", "NATS server to forward to (JetStream)")
	cmd.Flags().StringVar(&group, "group", forwarder.DefaultConsumerGroup, "consumer group of the forwarder")
	cmd.Flags().IntVar(&maxAttempts, "max-attempts", 0, "failed sends of a message before it goes to the dead-letter store; 0 (the default) retries sends for ever, since they fail when the broker is down, and what the broker refuses for good is dead-lettered at once")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	cmd.Flags().BoolVar(&wal, "wal", false, "also relay the messages published in ModeWAL from the schema's slot (outbox wal create-slot); one streams, the others wait")
	cmd.Flags().DurationVar(&takeover, "takeover-timeout", relay.DefaultTakeoverTimeout, "with --wal: how long a relay that stopped answering keeps the slot and its append before a standby takes over")
	cmd.Flags().StringVar(&instance, "instance", "", "with --wal: this relay's name in pg_stat_activity and in status, which show the relay streaming the slot (default host:pid)")
	cmd.Flags().BoolVar(&atLeastOnce, "at-least-once", false, "write Kafka without transactions (copies possible, each with the same outbox_id)")
	cmd.Flags().DurationVar(&keepFor, "keep-for", 0, "retention: keep consumed log rows this long, for replays (outbox reset-cursor); 0 deletes them once every group is past them")
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9464, path /metrics): the pipeline's, and each source's database figures")
	cmd.Flags().BoolVar(&noRetention, "no-retention", false, "run no retention vacuum (the log and the dealt-with dead letters then grow until something else deletes them)")
	return cmd
}

func retaining(off bool, keepFor time.Duration) string {
	switch {
	case off:
		return ", no retention"
	case keepFor > 0:
		return ", retention keeping consumed rows " + keepFor.String()
	}
	return ", retention"
}

func forwarding(topics, kafkaBrokers []string, natsURL string) string {
	switch {
	case len(topics) == 0:
		return ""
	case len(kafkaBrokers) > 0:
		return ", forwarding " + strings.Join(topics, ",") + " to Kafka " + strings.Join(kafkaBrokers, ",")
	}
	return ", forwarding " + strings.Join(topics, ",") + " to NATS " + natsURL
}

// pipelineFromFile fills the pipeline's settings from the --config file's pipeline
// section, for each flag not given on the command line.
func (a *app) pipelineFromFile(cmd *cobra.Command, topics, kafkaBrokers *[]string, natsURL, group *string, atLeastOnce *bool) {
	f := a.file.Pipeline
	changed := cmd.Flags().Changed
	if !changed("topic") && len(f.Topics) > 0 {
		*topics = f.Topics
	}
	if !changed("kafka") && len(f.Kafka) > 0 {
		*kafkaBrokers = f.Kafka
	}
	if !changed("nats") && f.NATS != "" {
		*natsURL = f.NATS
	}
	if !changed("group") && f.Group != "" {
		*group = f.Group
	}
	if !changed("at-least-once") && f.AtLeastOnce {
		*atLeastOnce = true
	}
}

// pipelineOne makes the pipeline of one database: --database-url, or the one
// source chosen (whose name its messages then carry, as when a fleet
// relays it).
func (a *app) pipelineOne(ctx context.Context, cfg pipeline.Config, logger watermill.LoggerAdapter) (func(context.Context) error, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	cfg.Schema, cfg.Pool = a.schemaName(), pool
	collector := metrics.CollectorConfig{Pool: pool, Schema: a.schemaName()}
	if a.chosen != nil {
		cfg.Source, collector.Source = a.chosen.Name, a.chosen.Name
	}
	p, err := pipeline.New(cfg, logger)
	if err != nil {
		return nil, err
	}
	a.collectors = append(a.collectors, collector)
	return p.Run, nil
}

// pipelineSources makes the fleet of every configured source: a pipeline per
// database. A source that does not answer at the start is retried by the
// fleet, like one that goes away later.
func (a *app) pipelineSources(ctx context.Context, cfg pipeline.Config, logger watermill.LoggerAdapter) (func(context.Context) error, error) {
	fc := pipeline.FleetConfig{Pipeline: cfg}
	for _, s := range a.sources {
		pool, err := a.openSource(ctx, s)
		if err != nil {
			return nil, err
		}
		fc.Sources = append(fc.Sources, pipeline.Source{Name: s.Name, Pool: pool, Schema: s.Schema})
		a.collectors = append(a.collectors, metrics.CollectorConfig{Pool: pool, Schema: s.Schema, Source: s.Name})
	}
	f, err := pipeline.NewFleet(fc, logger)
	if err != nil {
		return nil, err
	}
	return f.Run, nil
}
