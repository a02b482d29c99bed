package main

import (
	"context"
	"fmt"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/partitioning"
)

// verifyBrokers checks what each broker's consumer received against what
// was published and the log: every committed message arrived, under the
// outbox id of its log row, and nothing else did; the first arrivals of
// each key follow its versions. Copies of a message (at-least-once) carry
// the outbox id of its first arrival: counted on Kafka, where consumers
// deduplicate by it, and violations on NATS, where the server drops them
// by Nats-Msg-Id. Kafka records must also carry the order id as key and
// sit on the partition numbered like their outbox partition.
func (d *demo) verifyBrokers(context.Context) error {
	byUUID := d.publishedByUUID()
	ids := logIDs(d.log)
	for _, in := range []*received{d.kafkaIn, d.natsIn} {
		arrivals := in.snapshot()
		copies, badCopies := findCopies(arrivals)
		name := in.broker + ": "
		checks := []check{
			{name + "every committed message arrived", func() []string { return checkAllArrived(arrivals, d.published.messages) }},
			{name + "only committed messages arrived, each under the outbox id of its log row", func() []string { return checkArrivedKnown(arrivals, byUUID, ids) }},
			{name + "each key's first arrivals follow its versions", func() []string { return checkArrivalOrder(arrivals, byUUID) }},
		}
		if in == d.kafkaIn {
			checks = append(checks,
				check{name + "each record is keyed by its order and on the partition numbered like its outbox partition",
					func() []string { return checkKafkaPlacement(arrivals, byUUID, d.cfg.partitions) }},
				check{name + "copies repeat the outbox id of an earlier arrival", func() []string { return badCopies }})
		} else {
			checks = append(checks, check{name + "no message arrived twice (the server dropped copies by Nats-Msg-Id)",
				func() []string { return append(badCopies, copyViolations(copies)...) }})
		}
		fmt.Fprintf(d.out, "   %s: %d arrivals, %d of them copies of an earlier arrival\n", in.broker, len(arrivals), len(copies))
		d.runChecks(checks)
	}
	return nil
}

// publishedByUUID indexes the published messages.
func (d *demo) publishedByUUID() map[string]sent {
	m := make(map[string]sent, len(d.published.messages))
	for _, s := range d.published.messages {
		m[s.uuid] = s
	}
	return m
}

// logIDs maps each message in the log to its stable id.
func logIDs(log []logRow) map[string]string {
	ids := make(map[string]string, len(log))
	for _, r := range log {
		ids[r.uuid] = outbox.StableID(topic, r.partition, r.seq)
	}
	return ids
}

func checkAllArrived(arrivals []arrival, published []sent) []string {
	got := make(map[string]bool, len(arrivals))
	for _, a := range arrivals {
		got[a.uuid] = true
	}
	var out []string
	for _, m := range published {
		if m.committed && !got[m.uuid] {
			out = append(out, fmt.Sprintf("message %s (key %s, version %d.%d) did not arrive", m.uuid, m.key, m.version, m.index))
		}
	}
	return out
}

// checkArrivedKnown reports arrivals of messages that were not committed,
// and arrivals whose outbox id is not that of their message's log row.
func checkArrivedKnown(arrivals []arrival, byUUID map[string]sent, ids map[string]string) []string {
	var out []string
	for _, a := range arrivals {
		m, ok := byUUID[a.uuid]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("unknown message %s (outbox id %q)", a.uuid, a.id))
		case !m.committed:
			out = append(out, fmt.Sprintf("message %s of a rolled-back transaction (key %s, version %d)", a.uuid, m.key, m.version))
		case a.id != ids[a.uuid]:
			out = append(out, fmt.Sprintf("message %s arrived with outbox id %q, its log row is %q", a.uuid, a.id, ids[a.uuid]))
		}
	}
	return out
}

// checkArrivalOrder checks, per key, that the first arrival of each message
// comes after the first arrivals of the messages before it: version, then
// index within the version, increase. Copies are left out: they may come
// after messages that followed them.
func checkArrivalOrder(arrivals []arrival, byUUID map[string]sent) []string {
	type position struct{ version, index int64 }
	last := make(map[string]position)
	seen := make(map[string]bool)
	var out []string
	for _, a := range arrivals {
		m, ok := byUUID[a.uuid]
		if !ok || seen[a.id] {
			continue // unknown (reported elsewhere), or a copy
		}
		seen[a.id] = true
		pos := position{m.version, int64(m.index)}
		prev, had := last[m.key]
		if had && (pos.version < prev.version || pos.version == prev.version && pos.index <= prev.index) {
			out = append(out, fmt.Sprintf("key %s: version %d.%d (%s) arrived after version %d.%d",
				m.key, pos.version, pos.index, a.id, prev.version, prev.index))
		}
		last[m.key] = pos
	}
	return out
}

// checkKafkaPlacement checks that each record's key is its order id and
// that it was read from the Kafka partition murmur2 gives the key: the
// number of its outbox partition, as both have the same partition count.
func checkKafkaPlacement(arrivals []arrival, byUUID map[string]sent, partitions int) []string {
	var out []string
	for _, a := range arrivals {
		m, ok := byUUID[a.uuid]
		if !ok {
			continue
		}
		want, err := partitioning.Default().Partition(m.key, partitions)
		if a.recordKey != m.key || err != nil || a.partition != want {
			out = append(out, fmt.Sprintf("message %s (key %s, outbox partition %d): record key %q on Kafka partition %d",
				a.uuid, m.key, want, a.recordKey, a.partition))
		}
	}
	return out
}

// findCopies returns the arrivals whose outbox id arrived before (copies),
// and reports arrivals of a message that arrived before under another
// outbox id: a copy must carry the same one.
func findCopies(arrivals []arrival) (copies []arrival, bad []string) {
	idOf := make(map[string]string, len(arrivals)) // uuid -> outbox id of its first arrival
	for _, a := range arrivals {
		first, seen := idOf[a.uuid]
		switch {
		case !seen:
			idOf[a.uuid] = a.id
		case first == a.id:
			copies = append(copies, a)
		default:
			bad = append(bad, fmt.Sprintf("message %s arrived as %q and again as %q", a.uuid, first, a.id))
		}
	}
	return copies, bad
}

// copyViolations lists copies where none may arrive.
func copyViolations(copies []arrival) []string {
	out := make([]string, len(copies))
	for i, a := range copies {
		out[i] = "message " + a.uuid + " (" + a.id + ") arrived again"
	}
	return out
}
