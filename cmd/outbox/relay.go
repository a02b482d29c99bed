package main

import (
	"errors"
	"strings"
	"time"

	"github.com/spf13/cobra"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/pipeline"
	"github.com/millrace/watermill-outbox/relay"
	"github.com/millrace/watermill-outbox/retention"
)

func (a *app) relayCommand() *cobra.Command {
	var (
		kafkaBrokers []string
		natsURL      string
		topics       []string
		group        string
		maxAttempts  int
		verbose      bool
		atLeastOnce  bool
		wal          bool
		takeover     time.Duration
		instance     string
		keepFor      time.Duration
		noRetention  bool
	)
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Run a sequencer, retention, and a forwarder to Kafka or NATS JetStream (a pipeline)",
		Long: `relay runs until interrupted (SIGTERM or Ctrl-C; sends in flight finish first): the schema's pipeline
(package pipeline), that is a sequencer (give committed messages their seq), with --wal the relay of the log-based
mode (messages published in ModeWAL, read from the schema's slot), a retention vacuum (consumed log rows deleted once
every group is past them, or after --keep-for; dealt-with dead letters after a week; --no-retention for none) and,
with --topic and --kafka or --nats, a forwarder of those topics to the broker, as consumer group --group. A message the
broker refuses for good goes to the dead-letter store at once; failed sends (the broker down) are retried until it is
back, unless --max-attempts says how many. Run as many relays as you like: they share the work.

Kafka is written exactly once (Kafka transactions; consumers must read read_committed) unless --at-least-once.`,
		Example: `  outbox relay
  outbox relay --topic orders --topic invoices --kafka broker1:9092,broker2:9092
  outbox relay --topic orders --nats nats://localhost:4222
  outbox relay --wal --takeover-timeout 10s --topic orders --kafka broker1:9092
  outbox relay --wal --instance relay-a`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
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
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			logger := a.logger(verbose) // escapes what it logs
			cfg := pipeline.Config{Schema: a.schemaName(), Pool: pool, DisableRetention: noRetention,
				Retention: retention.Config{KeepFor: keepFor}}
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
			p, err := pipeline.New(cfg, logger)
			var bad *outbox.ConfigError
			switch {
			case errors.As(err, &bad) && bad.Field == "WAL.TakeoverTimeout":
				return usagef("--takeover-timeout %s %s", takeover, bad.Reason)
			case errors.As(err, &bad) && bad.Field == "WAL.Instance":
				return usagef("--instance: %s", bad.Reason)
			case errors.As(err, &bad) && bad.Field == "Retention.KeepFor":
				return usagef("--keep-for %s: %s", keepFor, bad.Reason)
			case err != nil:
				return err
			}
			mode := "sequencer"
			if wal {
				name := instance
				if name == "" {
					name = relay.DefaultInstance()
				}
				mode = "sequencer, WAL relay of slot " + relay.Slot(a.schemaName()) + " as instance " + name
			}
			a.note("relay running on schema %s (%s%s%s); interrupt to stop", a.schemaName(), mode, forwarding(topics, kafkaBrokers, natsURL), retaining(noRetention, keepFor))
			err = p.Run(ctx)
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
