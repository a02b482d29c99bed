package main

import (
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/millrace/watermill-outbox/deadletter"
)

func (a *app) dlqCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Browse, replay, discard and purge dead letters",
		Example: `  outbox dlq list --group billing --status pending
  outbox dlq show 42
  outbox dlq replay 42 --yes
  outbox dlq discard 43 --yes
  outbox dlq purge --older-than 720h --status replayed,discarded --yes`,
	}
	var (
		opts     deadletter.ListOptions
		statuses []string
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List dead letters (oldest first; --newest-first to reverse)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, err := a.deadLetters(cmd.Context())
			if err != nil {
				return err
			}
			for _, s := range statuses {
				opts.Statuses = append(opts.Statuses, deadletter.Status(s))
			}
			page, err := store.List(cmd.Context(), opts)
			if err != nil {
				return err
			}
			return a.print(page, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "ID\tGROUP\tTOPIC\tPARTITION\tSEQ\tUUID\tSTATUS\tATTEMPTS\tCREATED\tREASON")
				for _, e := range page.Entries {
					fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.Group, e.Topic, e.Partition, e.Seq, e.UUID,
						e.Status, e.Attempts, e.CreatedAt.Format(time.RFC3339), oneLine(e.Reason, 60))
				}
				if page.NextCursor != "" {
					fmt.Fprintf(w, "more: --after %s\n", page.NextCursor)
				}
			})
		},
	}
	list.Flags().StringVar(&opts.Group, "group", "", "only this consumer group")
	list.Flags().StringVar(&opts.Topic, "topic", "", "only this topic")
	list.Flags().StringSliceVar(&statuses, "status", nil, "only these statuses: pending, replayed, discarded")
	list.Flags().IntVar(&opts.Limit, "limit", 0, "page size (default 100)")
	list.Flags().StringVar(&opts.Cursor, "after", "", "continue after the previous page")
	list.Flags().BoolVar(&opts.Descending, "newest-first", false, "newest first")

	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter with its metadata and payload",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			store, err := a.deadLetters(cmd.Context())
			if err != nil {
				return err
			}
			e, err := store.Get(cmd.Context(), id)
			if err != nil {
				return err
			}
			return a.print(e, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "id\t%d\ngroup\t%s\ntopic\t%s\npartition\t%d\nseq\t%d\nuuid\t%s\nkey\t%s\nstatus\t%s\nattempts\t%d\nreason\t%s\n",
					e.ID, e.Group, e.Topic, e.Partition, e.Seq, e.UUID, e.PartitionKey, e.Status, e.Attempts, e.Reason)
				for k, v := range e.Metadata {
					fmt.Fprintf(w, "metadata\t%s = %s\n", k, v)
				}
				if utf8.Valid(e.Payload) {
					fmt.Fprintf(w, "payload\t%s\n", strconv.Quote(string(e.Payload)))
				} else {
					fmt.Fprintf(w, "payload\t%d bytes, not UTF-8: use -o json\n", len(e.Payload))
				}
			})
		},
	}

	var replayTopic string
	var yes bool
	replay := &cobra.Command{
		Use:   "replay ID",
		Short: "Publish a dead letter again (as a new message) and mark it replayed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			store, err := a.deadLetters(cmd.Context())
			if err != nil {
				return err
			}
			if err := a.confirm(yes, fmt.Sprintf("Replay dead letter %d?", id)); err != nil {
				return err
			}
			e, err := store.Replay(cmd.Context(), id, deadletter.ReplayOptions{Topic: replayTopic})
			if err != nil {
				return err
			}
			return a.print(e, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "replayed %d to %s as %s\n", e.ID, e.ReplayTopic, e.ReplayUUID)
			})
		},
	}
	replay.Flags().StringVar(&replayTopic, "topic", "", "publish to this topic instead of the entry's own")
	replay.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")

	var yesDiscard bool
	discard := &cobra.Command{
		Use:   "discard ID",
		Short: "Mark a pending dead letter discarded (handled elsewhere, not to be replayed)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			store, err := a.deadLetters(cmd.Context())
			if err != nil {
				return err
			}
			if err := a.confirm(yesDiscard, fmt.Sprintf("Discard dead letter %d?", id)); err != nil {
				return err
			}
			e, err := store.Discard(cmd.Context(), id)
			if err != nil {
				return err
			}
			return a.print(e, func(w *tabwriter.Writer) { fmt.Fprintf(w, "discarded %d\n", e.ID) })
		},
	}
	discard.Flags().BoolVar(&yesDiscard, "yes", false, "do not ask for confirmation")

	var (
		purge         deadletter.PurgeOptions
		purgeStatuses []string
		yesPurge      bool
	)
	purgeCmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete old dead letters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, err := a.deadLetters(cmd.Context())
			if err != nil {
				return err
			}
			for _, s := range purgeStatuses {
				purge.Statuses = append(purge.Statuses, deadletter.Status(s))
			}
			if err := a.confirm(yesPurge, fmt.Sprintf("Delete dead letters older than %v with status %v (all statuses when empty)?", purge.OlderThan, purgeStatuses)); err != nil {
				return err
			}
			n, err := store.Purge(cmd.Context(), purge)
			if err != nil {
				return err
			}
			return a.print(map[string]int64{"deleted": n}, func(w *tabwriter.Writer) { fmt.Fprintf(w, "deleted %d dead letters\n", n) })
		},
	}
	purgeCmd.Flags().DurationVar(&purge.OlderThan, "older-than", 0, "only entries created longer ago than this")
	purgeCmd.Flags().StringSliceVar(&purgeStatuses, "status", nil, "only these statuses")
	purgeCmd.Flags().BoolVar(&yesPurge, "yes", false, "do not ask for confirmation")

	cmd.AddCommand(list, show, replay, discard, purgeCmd)
	return cmd
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef("ID must be a positive number (see outbox dlq list), got %q", s)
	}
	return id, nil
}
