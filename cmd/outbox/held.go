package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/termsafe"
	"github.com/millrace/watermill-outbox/schema"
)

// heldCommand lists the keys consumer groups hold back (key isolation) and
// acts on one.
func (a *app) heldCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "held",
		Short: "List, retry or dead-letter the keys held back by key isolation",
		Long: `held shows the keys a consumer group holds back because their first message fails (SubscriberConfig.KeyIsolation),
while the rest of their partitions flows: the head's seq, attempts, next retry and last error, and how many messages wait.
retry makes the group retry a key at once with a fresh count of attempts; dead-letter takes every message the key holds
out through the group's RejectHandler, in order. A keyless message is named by --seq instead of --key.
With --schema-registry, list also shows each key's head message, its payload decoded as JSON when it is in the
registry's wire format.`,
		Example: `  outbox held list --group billing
  outbox held list --group billing --schema-registry http://registry:8081
  outbox held retry --group billing --topic orders --partition 3 --key customer-42
  outbox held dead-letter --group billing --topic orders --partition 3 --key customer-42 --yes`,
	}
	var f admin.Filter
	list := &cobra.Command{
		Use:     "list",
		Short:   "List the held keys",
		Example: "  outbox held list --group billing --topic orders",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			rep, err := adm.Status(cmd.Context(), f)
			if err != nil {
				return err
			}
			var out []heldRow
			for _, t := range rep.Topics {
				for _, g := range t.Groups {
					for _, p := range g.Partitions {
						for _, k := range p.HeldKeys {
							out = append(out, heldRow{Group: g.Group, Topic: t.Topic, Partition: p.Partition, HeldKey: k})
						}
					}
				}
			}
			codec, err := a.payloadDecoder(cmd.Context())
			if err != nil {
				return err
			}
			failed, first := 0, ""
			if codec != nil && len(out) > 0 {
				if failed, first, err = addHeads(cmd.Context(), adm, f, codec, out); err != nil {
					return err
				}
			}
			if err := a.print(out, func(w *termsafe.Writer) { heldTable(w, out, rep.At) }); err != nil {
				return err
			}
			return undecoded(failed, countHeads(out), first)
		},
	}
	list.Flags().StringVar(&f.Group, "group", "", "only this consumer group")
	list.Flags().StringVar(&f.Topic, "topic", "", "only this topic")
	a.schemaRegistryFlag(list, "show each held key's head message too, its payload decoded as JSON when in the registry's wire format")

	action := func(use, short, question string, do func(context.Context, *admin.Admin, admin.HeldRef) (int, error)) *cobra.Command {
		var (
			r   admin.HeldRef
			yes bool
		)
		c := &cobra.Command{
			Use:     use,
			Short:   short,
			Example: "  outbox held " + use + " --group billing --topic orders --partition 3 --key customer-42",
			Args:    cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if r.Group == "" || r.Topic == "" || (r.Key == "") == (r.Seq == 0) {
					return usagef("%s needs --group, --topic, --partition and either --key or --seq (a keyless message)", use)
				}
				adm, err := a.admin(cmd.Context())
				if err != nil {
					return err
				}
				name := fmt.Sprintf("key %q", r.Key)
				if r.Key == "" {
					name = fmt.Sprintf("keyless message %d", r.Seq)
				}
				if question != "" {
					if err := a.confirm(yes, question, name, r.Group, r.Topic, r.Partition); err != nil {
						return err
					}
				}
				n, err := do(cmd.Context(), adm, r)
				if err != nil {
					return err
				}
				return a.print(map[string]int{"messages": n}, func(w *termsafe.Writer) {
					w.Printf("%s: %s of group %s, topic %s, partition %d (%d messages held)\n", use, name, r.Group, r.Topic, r.Partition, n)
				})
			},
		}
		c.Flags().StringVar(&r.Group, "group", "", "the consumer group")
		c.Flags().StringVar(&r.Topic, "topic", "", "the topic")
		c.Flags().IntVar(&r.Partition, "partition", 0, "the partition")
		c.Flags().StringVar(&r.Key, "key", "", "the held partition key")
		c.Flags().Int64Var(&r.Seq, "seq", 0, "the seq of a held keyless message")
		if question != "" {
			c.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
		}
		return c
	}
	retry := action("retry", "Retry a held key at once, with a fresh count of attempts", "",
		func(ctx context.Context, adm *admin.Admin, r admin.HeldRef) (int, error) {
			return adm.RetryHeldNow(ctx, r)
		})
	deadLetter := action("dead-letter", "Take every message a held key holds out as dead letters", "Dead-letter every held message of %s of group %s, topic %s, partition %d?",
		func(ctx context.Context, adm *admin.Admin, r admin.HeldRef) (int, error) {
			return adm.DeadLetterHeld(ctx, r)
		})
	cmd.AddCommand(list, retry, deadLetter)
	return cmd
}

// heldRow is one held key in the output of held list.
type heldRow struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	admin.HeldKey
	// Head is the key's head message, with --schema-registry.
	Head *heldHead `json:"head,omitempty"`
}

// heldHead is a held key's head message in the output of held list: its
// payload, and that payload decoded as JSON (payload_json) when it is in
// the registry's wire format.
type heldHead struct {
	UUID    string `json:"uuid"`
	Payload []byte `json:"payload"`
	Missing bool   `json:"missing,omitempty"`
	decodedPayload
	decoded *decodedPayload // for the table; nil when not decoded
}

// addHeads reads the head message of each of rows' held keys and decodes
// its payload with codec. It returns how many payloads could not be
// decoded, and the first one's reason.
func addHeads(ctx context.Context, adm *admin.Admin, f admin.Filter, codec *schema.Codec, rows []heldRow) (failed int, first string, err error) {
	heads, err := adm.HeldHeads(ctx, f)
	if err != nil {
		return 0, "", err
	}
	type at struct {
		group, topic string
		partition    int
		seq          int64
	}
	byAt := make(map[at]admin.HeldHead, len(heads))
	for _, h := range heads {
		byAt[at{h.Group, h.Topic, h.Partition, h.Seq}] = h
	}
	for i, r := range rows {
		h, ok := byAt[at{r.Group, r.Topic, r.Partition, r.HeadSeq}]
		if !ok { // released since Status read it
			continue
		}
		head := &heldHead{UUID: h.UUID, Payload: h.Payload, Missing: h.Missing}
		if d, ok := decodePayload(ctx, codec, h.Payload); ok {
			head.decodedPayload, head.decoded = d, &d
			if d.Error != "" {
				failed++
				if first == "" {
					first = d.Error
				}
			}
		}
		rows[i].Head = head
	}
	return failed, first, nil
}

// countHeads counts the rows with a head payload decoded or not.
func countHeads(rows []heldRow) int {
	n := 0
	for _, r := range rows {
		if r.Head != nil && r.Head.decoded != nil {
			n++
		}
	}
	return n
}

func heldTable(w *termsafe.Writer, rows []heldRow, at time.Time) {
	if len(rows) == 0 {
		w.Printf("no held keys\n")
		return
	}
	w.Printf("GROUP\tTOPIC\tPART\tKEY\tHEAD_SEQ\tMESSAGES\tATTEMPTS\tRETRY_IN\tREQUESTED\tLAST_ERROR\n")
	for _, r := range rows {
		key := r.Key
		if r.Keyless {
			key = "(keyless)"
		}
		retry := "now"
		if r.RetryAt != nil && r.RetryAt.After(at) {
			retry = r.RetryAt.Sub(at).Round(time.Second).String()
		}
		w.Printf("%s\t%s\t%d\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", r.Group, r.Topic, r.Partition, oneLine(key, 40), r.HeadSeq, r.Messages,
			r.Attempts, retry, r.Requested, oneLine(r.LastError, 60))
	}
	for _, r := range rows {
		if r.Head == nil {
			continue
		}
		key := fmt.Sprintf("key %s", strconv.Quote(r.Key))
		if r.Keyless {
			key = "keyless message"
		}
		w.Printf("\nhead of %s: group %s, topic %s, partition %d, seq %d, uuid %s\n", key, r.Group, r.Topic, r.Partition, r.HeadSeq, r.Head.UUID)
		if r.Head.Missing {
			w.Printf("payload\tmissing: the log no longer holds it\n")
			continue
		}
		printPayload(w, r.Head.Payload, r.Head.decoded)
	}
}
