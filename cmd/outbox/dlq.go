package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/termsafe"
)

func (a *app) dlqCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Browse, replay, discard and purge dead letters",
		Example: `  outbox dlq list --group billing --status pending
  outbox dlq show 42
  outbox dlq show 42 --schema-registry http://registry:8081
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
			if len(page.Entries) == 0 && opts.Cursor == "" {
				// No entries: for a group or topic the outbox does not know
				// either, say so rather than print an empty list.
				if err := a.knownToDeadLetters(cmd.Context(), store, opts.Group, opts.Topic); err != nil {
					return err
				}
			}
			return a.print(page, func(w *termsafe.Writer) {
				w.Printf("ID\tGROUP\tTOPIC\tPARTITION\tSEQ\tUUID\tSTATUS\tATTEMPTS\tCREATED\tREASON\n")
				for _, e := range page.Entries {
					w.Printf("%d\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.Group, e.Topic, e.Partition, e.Seq, e.UUID,
						e.Status, e.Attempts, e.CreatedAt.Format(time.RFC3339), oneLine(e.Reason, 60))
				}
				if page.NextCursor != "" {
					w.Printf("more: --after %s\n", page.NextCursor)
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
			codec, err := a.payloadDecoder(cmd.Context())
			if err != nil {
				return err
			}
			out := shownEntry{Entry: e}
			if d, ok := decodePayload(cmd.Context(), codec, e.Payload); ok {
				out.decodedPayload, out.decoded = d, &d
			}
			if err := a.print(out, func(w *termsafe.Writer) {
				w.Printf("id\t%d\ngroup\t%s\ntopic\t%s\npartition\t%d\nseq\t%d\nuuid\t%s\nkey\t%s\nstatus\t%s\nattempts\t%d\nreason\t%s\n",
					e.ID, e.Group, e.Topic, e.Partition, e.Seq, e.UUID, e.PartitionKey, e.Status, e.Attempts, e.Reason)
				for _, k := range slices.Sorted(maps.Keys(e.Metadata)) {
					w.Printf("metadata\t%s = %s\n", k, e.Metadata[k])
				}
				printPayload(w, e.Payload, out.decoded)
			}); err != nil {
				return err
			}
			if out.Error != "" {
				return undecoded(1, 1, out.Error)
			}
			return nil
		},
	}
	a.schemaRegistryFlag(show, "show a payload in the registry's wire format decoded as JSON too")

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
			if err := a.confirm(yes, "Replay dead letter %d?", id); err != nil {
				return err
			}
			e, err := store.Replay(cmd.Context(), id, deadletter.ReplayOptions{Topic: replayTopic})
			if err != nil {
				return err
			}
			return a.print(e, func(w *termsafe.Writer) {
				w.Printf("replayed %d to %s as %s\n", e.ID, e.ReplayTopic, e.ReplayUUID)
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
			if err := a.confirm(yesDiscard, "Discard dead letter %d?", id); err != nil {
				return err
			}
			e, err := store.Discard(cmd.Context(), id)
			if err != nil {
				return err
			}
			return a.print(e, func(w *termsafe.Writer) { w.Printf("discarded %d\n", e.ID) })
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
		Short: "Delete old replayed and discarded dead letters (pending ones only with --status pending)",
		Long: `purge deletes the dead letters created before --older-than (default: any age) in the statuses of --status,
by default replayed and discarded: their messages were dealt with. A pending dead letter is a message nobody has
handled yet, and once deleted it can never be replayed: purge deletes pending ones only when --status names pending.
It first counts what it would delete, by status, and asks before deleting (unless --yes).`,
		Example: `  outbox dlq purge --older-than 720h
  outbox dlq purge --group billing --older-than 720h
  outbox dlq purge --older-than 720h --status replayed,discarded,pending --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, err := a.deadLetters(cmd.Context())
			if err != nil {
				return err
			}
			for _, s := range purgeStatuses {
				purge.Statuses = append(purge.Statuses, deadletter.Status(s))
			}
			plan, err := store.PlanPurge(cmd.Context(), purge)
			if err != nil {
				return err
			}
			age := "of any age"
			if purge.OlderThan > 0 {
				age = fmt.Sprintf("older than %v (created before %s)", purge.OlderThan, plan.Before.Format(time.RFC3339))
			}
			if purge.Group != "" {
				age += fmt.Sprintf(" of group %q", purge.Group)
			}
			if purge.Topic != "" {
				age += fmt.Sprintf(" on topic %s", purge.Topic)
			}
			if plan.Deleted() == 0 {
				return a.print(map[string]any{"deleted": 0, "plan": plan}, func(w *termsafe.Writer) {
					w.Printf("no dead letters to delete: none %s is %s.%s\n", age, statusList(plan.Statuses), kept(plan))
				})
			}
			if err := a.confirm(yesPurge, "Delete %d dead letters %s: %s.%s", plan.Deleted(), age, counts(plan, plan.Statuses), kept(plan)); err != nil {
				return err
			}
			purge.OlderThan, purge.Before = 0, plan.Before // what was counted
			n, err := store.Purge(cmd.Context(), purge)
			if err != nil {
				return err
			}
			return a.print(map[string]any{"deleted": n, "plan": plan}, func(w *termsafe.Writer) {
				w.Printf("deleted %d dead letters (%s).%s\n", n, statusList(plan.Statuses), kept(plan))
			})
		},
	}
	purgeCmd.Flags().DurationVar(&purge.OlderThan, "older-than", 0, "only entries created longer ago than this")
	purgeCmd.Flags().StringSliceVar(&purgeStatuses, "status", nil, "the statuses to delete (default replayed,discarded; pending only when named)")
	purgeCmd.Flags().StringVar(&purge.Group, "group", "", "only this consumer group's dead letters")
	purgeCmd.Flags().StringVar(&purge.Topic, "topic", "", "only this topic's dead letters")
	purgeCmd.Flags().BoolVar(&yesPurge, "yes", false, "do not ask for confirmation")

	cmd.AddCommand(list, show, replay, discard, purgeCmd)
	return cmd
}

// shownEntry is a dead letter in the output of dlq show: with
// --schema-registry, its payload decoded as JSON (payload_json).
type shownEntry struct {
	deadletter.Entry
	decodedPayload
	decoded *decodedPayload // for the table; nil when not decoded
}

// counts lists the plan's counts of statuses: "3 replayed, 5 discarded".
func counts(plan deadletter.PurgePlan, statuses []deadletter.Status) string {
	var parts []string
	for _, st := range statuses {
		parts = append(parts, fmt.Sprintf("%d %s", plan.Counts[st], st))
	}
	return strings.Join(parts, ", ")
}

// statusList names statuses: "replayed or discarded".
func statusList(statuses []deadletter.Status) string {
	names := make([]string, len(statuses))
	for i, st := range statuses {
		names[i] = string(st)
	}
	return strings.Join(names, " or ")
}

// kept is a sentence on the pending dead letters of the purge's age: how
// many are kept when the purge does not name pending, and that they can
// never be replayed once deleted when it does.
func kept(plan deadletter.PurgePlan) string {
	n := plan.Counts[deadletter.StatusPending]
	switch {
	case n == 0:
		return ""
	case slices.Contains(plan.Statuses, deadletter.StatusPending):
		return fmt.Sprintf(" The %d pending ones were never replayed or discarded: deleted, they can never be replayed.", n)
	}
	return fmt.Sprintf(" %d pending dead letters of that age are kept (they can still be replayed; --status pending purges them too).", n)
}

// knownToDeadLetters returns nil when the dead-letter store holds entries
// of group and topic (those given), or the outbox knows them (admin:
// a registered topic, a group with cursors or members); otherwise the
// *admin.NotFoundError that says which is unknown.
func (a *app) knownToDeadLetters(ctx context.Context, store *deadletter.Store, group, topic string) error {
	if group == "" && topic == "" {
		return nil
	}
	n, err := store.Count(ctx, deadletter.Filter{Group: group, Topic: topic})
	if err != nil || n > 0 {
		return err
	}
	adm, err := a.admin(ctx)
	if err != nil {
		return err
	}
	return adm.Exists(ctx, admin.Filter{Group: group, Topic: topic})
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef("ID must be a positive number (see outbox dlq list), got %q", s)
	}
	return id, nil
}

// payloadPreviewBytes is how much of a payload dlq show prints in a table,
// as much as the console's dead-letter page shows: a 1 MB payload would
// bury the rest of the entry (-o json has it whole).
const payloadPreviewBytes = 16 << 10

// payloadPreview returns the first payloadPreviewBytes of a UTF-8 payload,
// cut at a character boundary, and whether it was cut.
func payloadPreview(p []byte) (string, bool) {
	if len(p) <= payloadPreviewBytes {
		return string(p), false
	}
	n := payloadPreviewBytes
	for n > 0 && !utf8.RuneStart(p[n]) {
		n--
	}
	return string(p[:n]), true
}
