package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/termsafe"
)

func (a *app) statusCommand() *cobra.Command {
	var (
		f     admin.Filter
		watch time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show topics, consumer groups and partitions: lag, leases, failures, dead letters",
		Long: `status shows, per topic and consumer group, every partition: its head and the group's cursor, the lag in
messages and seconds, the lease owner and expiry, whether it is paused, degraded or backing off, the attempts and
last error of its next message, the keys held back by key isolation (see outbox held), and the group's pending dead
letters. --watch refreshes it.`,
		Example: `  outbox status
  outbox status --group billing --topic orders
  outbox status --watch 2s
  outbox status -o json | jq '.topics[].groups[] | {group, lag}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.multiSource() {
				return a.watch(cmd.Context(), watch, func() error {
					rep, err := a.statusSources(cmd.Context(), f)
					a.clearScreen(watch)
					if perr := a.print(rep, func(w *termsafe.Writer) { sourcesTable(w, rep) }); perr != nil {
						return perr
					}
					if err != nil && watch > 0 {
						a.note("%v", err) // a source down stays on the screen
						return nil
					}
					return err
				})
			}
			adm, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			return a.watch(cmd.Context(), watch, func() error {
				rep, err := adm.Status(cmd.Context(), f)
				if err != nil {
					return err
				}
				a.clearScreen(watch)
				return a.print(rep, func(w *termsafe.Writer) { statusTable(w, rep) })
			})
		},
	}
	cmd.Flags().StringVar(&f.Group, "group", "", "only this consumer group")
	cmd.Flags().StringVar(&f.Topic, "topic", "", "only this topic")
	cmd.Flags().DurationVar(&watch, "watch", 0, "refresh every interval (e.g. 2s) until interrupted")
	return cmd
}

// clearScreen clears the terminal before a table of --watch.
func (a *app) clearScreen(every time.Duration) {
	if every > 0 && a.output == "table" {
		fmt.Fprint(a.stdout, "\033[H\033[2J")
	}
}

// watch calls show once, or with every > 0 every interval until ctx ends
// or show fails.
func (a *app) watch(ctx context.Context, every time.Duration, show func() error) error {
	for {
		if err := show(); err != nil || every <= 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every):
		}
	}
}

func statusTable(w *termsafe.Writer, rep admin.Report) {
	w.Printf("at %s\n", rep.At.Format(time.RFC3339))
	if s := rep.WALSlot; s != nil {
		relay := fmt.Sprintf("a relay streams it: %s (server pid %d)", s.ActiveInstance, s.ActivePID)
		if !s.Active {
			relay = "NO RELAY STREAMS IT (messages published in ModeWAL wait; run outbox pipeline --wal)"
		}
		w.Printf("wal slot %s: %s; keeps %d bytes of WAL (%s)\n", s.Slot, relay, s.RetainedWALBytes, s.WALStatus)
	}
	for _, t := range rep.Topics {
		held := ""
		if t.DedupKeys > 0 {
			held = fmt.Sprintf(", %d dedup keys", t.DedupKeys)
			if t.DedupKeys >= admin.DedupKeysCountLimit {
				held = fmt.Sprintf(", %d+ dedup keys", t.DedupKeys)
			}
		}
		if t.RetentionHeldBy != "" {
			held += ", retention held by " + t.RetentionHeldBy
		}
		delayed := ""
		if t.Delayed > 0 && t.NextDueAt != nil {
			delayed = fmt.Sprintf(" (%d delayed, next due at %s", t.Delayed, t.NextDueAt.Format(time.RFC3339))
			if t.BehindDelayed > 0 {
				delayed += fmt.Sprintf("; %d more wait behind them in their keys' order", t.BehindDelayed)
			}
			delayed += ")"
		}
		if t.ForwardOnly {
			w.Printf("\ntopic %s (forwarder-only): %d partitions, %d forwarded, %d pending%s%s\n", t.Topic, t.Partitions, t.Sequenced, t.Unsequenced, delayed, held)
		} else {
			w.Printf("\ntopic %s: %d partitions, %d sequenced, %d pending%s%s\n", t.Topic, t.Partitions, t.Sequenced, t.Unsequenced, delayed, held)
		}
		for _, g := range t.Groups {
			w.Printf("  group %s: lag %d (%.1fs), %d members, %d leased, %d paused, %d failing, %d backing off, %d keys held, %d dead letters\n",
				g.Group, g.Lag, g.MaxLagSeconds, len(g.Members), g.Leased, g.Paused, g.Failing, g.BackingOff, g.HeldKeys, g.DeadLetters)
			if len(g.Partitions) == 0 {
				continue
			}
			w.Printf("  PART\tHEAD\tCURSOR\tLAG\tLAG_S\tLEASE\tSTATE\tATTEMPTS\tLAST_ERROR\n")
			for _, p := range g.Partitions {
				lease := "-"
				if p.Leased {
					lease = p.LeaseOwner
					if p.LeaseExpiresAt != nil {
						lease += " until " + p.LeaseExpiresAt.Format("15:04:05")
					}
				}
				var state []string
				if p.Paused {
					state = append(state, "paused")
				}
				if p.AdaptiveState != "" && p.AdaptiveState != "normal" {
					state = append(state, p.AdaptiveState)
				}
				if p.BackingOff {
					state = append(state, "backing-off")
				}
				if len(p.HeldKeys) > 0 {
					state = append(state, fmt.Sprintf("%d-keys-held", len(p.HeldKeys)))
				}
				if p.IsolationFullSince != nil {
					state = append(state, "isolation-full")
				}
				if len(state) == 0 {
					state = append(state, "ok")
				}
				w.Printf("  %d\t%d\t%d\t%d\t%.1f\t%s\t%s\t%d\t%s\n", p.Partition, p.HeadSeq, p.Cursor, p.Lag, p.LagSeconds,
					lease, strings.Join(state, ","), p.Attempts, oneLine(p.LastError, 60))
			}
		}
	}
}

// oneLine shortens s to one line of at most n runes, for tables.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func (a *app) groupsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "groups", Short: "List or delete consumer groups", Example: "  outbox groups list --topic orders\n  outbox groups delete old-reporting --yes"}
	var topic string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the consumer groups per topic",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			rep, err := adm.Status(cmd.Context(), admin.Filter{Topic: topic})
			if err != nil {
				return err
			}
			type group struct {
				Topic         string  `json:"topic"`
				Group         string  `json:"group"`
				Lag           int64   `json:"lag"`
				MaxLagSeconds float64 `json:"max_lag_seconds"`
				Members       int     `json:"members"`
				Paused        int     `json:"paused"`
				DeadLetters   int64   `json:"dead_letters"`
			}
			out := []group{}
			for _, t := range rep.Topics {
				for _, g := range t.Groups {
					out = append(out, group{t.Topic, g.Group, g.Lag, g.MaxLagSeconds, len(g.Members), g.Paused, g.DeadLetters})
				}
			}
			return a.print(out, func(w *termsafe.Writer) {
				w.Printf("TOPIC\tGROUP\tLAG\tLAG_S\tMEMBERS\tPAUSED\tDEAD_LETTERS\n")
				for _, g := range out {
					w.Printf("%s\t%s\t%d\t%.1f\t%d\t%d\t%d\n", g.Topic, g.Group, g.Lag, g.MaxLagSeconds, g.Members, g.Paused, g.DeadLetters)
				}
			})
		},
	}
	list.Flags().StringVar(&topic, "topic", "", "only this topic")
	var opts admin.DeleteGroupOptions
	var yes bool
	del := &cobra.Command{
		Use:   "delete GROUP",
		Short: "Delete a consumer group's cursors and members (it then stops holding retention back)",
		Long: `delete removes a consumer group's cursors and member rows, on one topic (--topic) or all. It refuses a group
with live members or leases unless --force. Its dead letters are kept unless --dead-letters.`,
		Example: "  outbox groups delete old-reporting --topic orders --yes",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			adm, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			what := "topic " + opts.Topic
			if opts.Topic == "" {
				what = "every topic"
			}
			if err := a.confirm(yes, "Delete consumer group %s on %s?", args[0], what); err != nil {
				return err
			}
			res, err := adm.DeleteGroup(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			return a.print(res, func(w *termsafe.Writer) {
				w.Printf("deleted group %s: %d cursors, %d members, %d dead letters\n", args[0], res.Cursors, res.Members, res.DeadLetters)
			})
		},
	}
	del.Flags().StringVar(&opts.Topic, "topic", "", "only on this topic")
	del.Flags().BoolVar(&opts.Force, "force", false, "delete even with live members or leases")
	del.Flags().BoolVar(&opts.DeadLetters, "dead-letters", false, "also delete the group's dead letters")
	del.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	cmd.AddCommand(list, del)
	return cmd
}

// scopeFlags adds --group, --topic and --partition to cmd.
func scopeFlags(cmd *cobra.Command, s *admin.Scope) {
	cmd.Flags().StringVar(&s.Group, "group", "", "consumer group (required)")
	cmd.Flags().StringVar(&s.Topic, "topic", "", "topic (default: all the group's topics)")
	cmd.Flags().IntSliceVar(&s.Partitions, "partition", nil, "partitions (repeat or comma-separate; default: all)")
	_ = cmd.MarkFlagRequired("group")
}

func (a *app) pauseCommand(pause bool) *cobra.Command {
	var s admin.Scope
	use, short, verb := "pause", "Pause a consumer group's partitions (members give their leases back)", "paused"
	if !pause {
		use, short, verb = "resume", "Resume a consumer group's paused partitions", "resumed"
	}
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: fmt.Sprintf("  outbox %s --group billing --topic orders --partition 3", use),
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			op := adm.Resume
			if pause {
				op = adm.Pause
			}
			n, err := op(cmd.Context(), s)
			if err != nil {
				return err
			}
			return a.print(map[string]any{"group": s.Group, "topic": s.Topic, "partitions": n, verb: true}, func(w *termsafe.Writer) {
				w.Printf("%s %d partitions of group %s\n", verb, n, s.Group)
			})
		},
	}
	scopeFlags(cmd, &s)
	return cmd
}

func (a *app) resetCommand() *cobra.Command {
	var (
		s      admin.Scope
		toSeq  int64
		toTime string
		yes    bool
	)
	cmd := &cobra.Command{
		Use:   "reset",
		Short: "Move a consumer group's cursors to a seq or a time (replay or skip)",
		Long: `reset moves the cursors of a consumer group on a topic to --to-seq (the next message is seq+1) or to
--to-time (the first message sequenced at or after it, RFC 3339), backwards to replay or forwards to skip. The
partitions' leases are revoked, so the group goes on from the new cursors.`,
		Example: `  outbox reset --group billing --topic orders --to-time 2026-11-22T10:00:00Z --yes
  outbox reset --group billing --topic orders --partition 3 --to-seq 1200`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var pos admin.Position
			switch {
			case cmd.Flags().Changed("to-seq") == (toTime != ""):
				return usagef("give exactly one of --to-seq and --to-time")
			case toTime != "":
				t, err := time.Parse(time.RFC3339, toTime)
				if err != nil {
					return usagef("--to-time: %v (use RFC 3339, e.g. 2026-11-22T10:00:00Z)", err)
				}
				pos = admin.ToTime(t)
			default:
				pos = admin.ToSeq(toSeq)
			}
			if s.Topic == "" {
				return usagef("reset needs --topic")
			}
			adm, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			if err := a.confirm(yes, "Move the cursors of group %s on %s (partitions %v)?", s.Group, s.Topic, s.Partitions); err != nil {
				return err
			}
			resets, err := adm.ResetCursor(cmd.Context(), s, pos)
			if err != nil {
				return err
			}
			return a.print(resets, func(w *termsafe.Writer) {
				w.Printf("TOPIC\tPARTITION\tFROM\tTO\n")
				for _, r := range resets {
					w.Printf("%s\t%d\t%d\t%d\n", r.Topic, r.Partition, r.From, r.To)
				}
			})
		},
	}
	scopeFlags(cmd, &s)
	cmd.Flags().Int64Var(&toSeq, "to-seq", 0, "the seq of the last message to count as done")
	cmd.Flags().StringVar(&toTime, "to-time", "", "replay from the first message sequenced at or after this time (RFC 3339)")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	return cmd
}
