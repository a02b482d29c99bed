package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/millrace/watermill-outbox/relay"
)

// walCommand manages the log-based mode's replication slot.
func (a *app) walCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "wal",
		Short: "Create, inspect or drop the log-based mode's replication slot",
		Long: `wal manages what the log-based mode (PublisherConfig.Mode = outbox.ModeWAL) needs in the database: a logical
replication slot and a publication, both named <schema>_wal. From the moment the slot exists PostgreSQL keeps the WAL
no relay has read: run "outbox relay --wal" (or a relay.Relay in a service), watch "outbox wal status", and drop the
slot when the mode is no longer used. The server needs wal_level = logical and the role the REPLICATION attribute.`,
		Example: `  outbox wal create-slot
  outbox wal status
  outbox wal drop-slot --yes`,
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
			fmt.Fprintf(a.stdout, "slot %s ready; run a relay (outbox relay --wal)\n", relay.Slot(a.schemaName()))
			return nil
		},
	}
	var yes bool
	drop := &cobra.Command{
		Use:   "drop-slot",
		Short: "Drop the slot and the publication; messages not yet relayed are lost",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.confirm(yes, fmt.Sprintf("Drop slot %s? Messages published in ModeWAL and not yet relayed are lost.", relay.Slot(a.schemaName()))); err != nil {
				return err
			}
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			if err := relay.DropSlot(cmd.Context(), pool, a.schemaName()); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "slot %s dropped\n", relay.Slot(a.schemaName()))
			return nil
		},
	}
	drop.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
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
			return a.print(st, func(w *tabwriter.Writer) {
				if !st.Exists {
					fmt.Fprintf(w, "slot %s does not exist (outbox wal create-slot)\n", st.Slot)
					return
				}
				fmt.Fprintln(w, "SLOT\tACTIVE\tRETAINED WAL\tWAL STATUS\tCONFIRMED\tAPPENDED")
				fmt.Fprintf(w, "%s\t%v\t%d bytes\t%s\t%X/%X\t%X/%X\n", st.Slot, st.Active, st.RetainedWALBytes, st.WALStatus,
					st.ConfirmedLSN>>32, uint32(st.ConfirmedLSN), st.AppendedLSN>>32, uint32(st.AppendedLSN))
			})
		},
	}
	cmd.AddCommand(create, drop, status)
	return cmd
}
