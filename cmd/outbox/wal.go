package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/millrace/watermill-outbox/internal/termsafe"
	"github.com/millrace/watermill-outbox/relay"
)

// walCommand manages the log-based mode's replication slot.
func (a *app) walCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "wal",
		Short: "Create, inspect or drop the log-based mode's replication slot",
		Long: `wal manages what the log-based mode (PublisherConfig.Mode = outbox.ModeWAL) needs in the database: a logical
replication slot and a publication, both named <schema>_wal. From the moment the slot exists PostgreSQL keeps the WAL
no relay has read: run "outbox pipeline --wal" (or a relay.Relay in a service), watch "outbox wal status", and drop the
slot when the mode is no longer used. The server needs wal_level = logical and the role the REPLICATION attribute.
Publishers in ModeWAL fail (ErrNoSlot) while the slot does not exist: their transactions cannot commit without their
messages.`,
		Example: `  outbox wal create-slot
  outbox wal status
  outbox wal drop-slot --yes
  outbox wal drop-slot --yes --force`,
	}
	create := &cobra.Command{
		Use:   "create-slot",
		Short: "Create the slot and the publication (does nothing that exists)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			if err := relay.CreateSlot(cmd.Context(), pool, a.schemaName()); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "slot %s ready; run a relay (outbox pipeline --wal)\n", relay.Slot(a.schemaName()))
			return nil
		},
	}
	var yes, force bool
	drop := &cobra.Command{
		Use:   "drop-slot",
		Short: "Drop the slot and the publication (refused while it holds messages not yet relayed, unless --force)",
		Long: `drop-slot drops the slot and the publication. Publishers in ModeWAL of the schema fail from then on. It refuses
while a relay streams the slot, and, unless --force, while the slot holds committed messages no relay has appended to
the log yet or transactions that published into it are open: it says how many. With --force those messages are lost.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			question := fmt.Sprintf("Drop slot %s? Publishers in ModeWAL of the schema will fail until it is created again.", relay.Slot(a.schemaName()))
			if force {
				question = fmt.Sprintf("Drop slot %s even if it holds messages not yet relayed (--force)? They are lost, and publishers in ModeWAL of the schema will fail until it is created again.", relay.Slot(a.schemaName()))
			}
			if err := a.confirm(yes, "%s", question); err != nil {
				return err
			}
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			if err := relay.DropSlot(cmd.Context(), pool, a.schemaName(), force); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "slot %s dropped\n", relay.Slot(a.schemaName()))
			return nil
		},
	}
	drop.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	drop.Flags().BoolVar(&force, "force", false, "drop the slot even if it holds messages not yet appended to the log, or transactions that published into it are open (they are lost)")
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the slot: whether a relay streams it, and the WAL it keeps",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			st, err := relay.StatusOf(cmd.Context(), pool, a.schemaName())
			if err != nil {
				return err
			}
			return a.print(st, func(w *termsafe.Writer) {
				if !st.Exists {
					w.Printf("slot %s does not exist (outbox wal create-slot)\n", st.Slot)
					return
				}
				streamer := "-"
				if st.Active {
					streamer = fmt.Sprintf("%s (server pid %d)", st.ActiveInstance, st.ActivePID)
				}
				w.Printf("SLOT\tACTIVE\tSTREAMED BY\tRETAINED WAL\tWAL STATUS\tCONFIRMED\tAPPENDED\n")
				w.Printf("%s\t%v\t%s\t%d bytes\t%s\t%X/%X\t%X/%X\n", st.Slot, st.Active, streamer, st.RetainedWALBytes, st.WALStatus,
					st.ConfirmedLSN>>32, uint32(st.ConfirmedLSN), st.AppendedLSN>>32, uint32(st.AppendedLSN))
			})
		},
	}
	cmd.AddCommand(create, drop, status)
	return cmd
}
