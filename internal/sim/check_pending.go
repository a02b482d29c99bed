package sim

import (
	"slices"

	outbox "github.com/millrace/watermill-outbox"
	kafkatarget "github.com/millrace/watermill-outbox/forwarder/kafka"
)

// The checks of a forwarder-only topic (sh.direct): there is no log, so
// the numbering is what the forwarders gave, read back from Kafka and the
// dead letters.

// drainedPending reports whether every message is committed, none waits
// in pending, and every partition's cursor stands at its last seq.
func (w *world) drainedPending() bool {
	if w.publishedCount() < w.sh.messages || len(w.openPubs) > 0 || w.db.pendingLeft() > 0 || !w.wal.appended() {
		return false
	}
	ps := w.db.pendingState()
	for p := range w.sh.partitions {
		r := w.db.cursors[cursorKey{group, topic, p}]
		if r == nil || r.seq != ps.lastSeq[p] {
			return false
		}
	}
	return true
}

// checkPending verifies the invariants of a forwarder-only topic after the
// drain:
//
//  1. Kafka's committed records of the outbox, per outbox partition
//     within each Kafka partition, in seq order, each seq once;
//  2. each partition's seqs 1..n, n its committed messages, each taken
//     by exactly one message: in Kafka (not poison) or dead-lettered
//     (poison), no message twice, none lost, none never published;
//  3. order per key: a message committed before another of its key was
//     inserted has the smaller seq (the commit order of transactions
//     serialized on a key);
//  4. pending is empty, every cursor and partitions.last_seq at n.
func (w *world) checkPending() {
	res := w.res
	res.ForwardOnly = true
	res.Reconciled = w.reconciled
	for _, in := range w.instances {
		w.noteGone(in)
	}
	res.Reconciled = w.reconciled
	committed := map[int][]pubMsg{}
	byUUID := map[string]pubMsg{}
	for _, t := range w.published {
		for _, m := range t.msgs {
			committed[m.partition] = append(committed[m.partition], m)
			byUUID[m.uuid] = m
		}
	}
	type taken struct {
		uuid string
		dead bool
	}
	seqs := map[int]map[int64][]taken{} // partition -> seq -> what took it
	note := func(p int, seq int64, x taken) {
		if seqs[p] == nil {
			seqs[p] = map[int64][]taken{}
		}
		seqs[p][seq] = append(seqs[p][seq], x)
	}
	// 1.
	for kp, part := range w.k.topics[topic] {
		last := map[int]int64{}
		for _, r := range part.committedRecords(0, int64(len(part.records))) {
			id, source, uuid := r.header(outbox.MetadataID), r.header(outbox.MetadataSource), r.header(kafkatarget.UUIDHeaderKey)
			if source != "" {
				continue // another producer's
			}
			p, seq, ok := parseID(id)
			if !ok {
				w.fail("kafka partition %d offset %d: a record without a valid %s header (%q)", kp, r.offset, outbox.MetadataID, id)
				continue
			}
			if seq <= last[p] {
				w.fail("kafka partition %d offset %d: outbox partition %d seq %d after seq %d (order per key broken, or a duplicate)", kp, r.offset, p, seq, last[p])
			}
			last[p] = seq
			note(p, seq, taken{uuid: uuid})
			res.InKafka++
			if m, ok := byUUID[uuid]; ok && string(r.key) != m.key {
				w.fail("message %s: Kafka's record has key %q, the outbox %q", uuid, r.key, m.key)
			}
		}
	}
	for _, d := range w.db.dead {
		note(d.partition, d.seq, taken{uuid: d.uuid, dead: true})
		res.Dead++
	}
	// 2.
	seqOf := map[string]int64{}
	ps := w.db.pendingState()
	for p := range w.sh.partitions {
		n := int64(len(committed[p]))
		for seq := range seqs[p] {
			if seq > n {
				w.fail("partition %d: seq %d was given, only %d messages were committed (a message numbered twice)", p, seq, n)
			}
		}
		for seq := int64(1); seq <= n; seq++ {
			xs := seqs[p][seq]
			switch {
			case len(xs) == 0:
				w.fail("partition %d seq %d is in no committed Kafka transaction and not dead-lettered: a message is LOST", p, seq)
				continue
			case len(xs) > 1:
				w.fail("partition %d seq %d was taken %d times: %v", p, seq, len(xs), xs)
			}
			x := xs[0]
			m, ok := byUUID[x.uuid]
			switch {
			case !ok:
				w.fail("partition %d seq %d: message %q was never committed", p, seq, x.uuid)
				continue
			case m.partition != p:
				w.fail("partition %d seq %d: message %s belongs to partition %d", p, seq, x.uuid, m.partition)
			case m.poison && !x.dead:
				w.fail("poison message %s (partition %d seq %d) is in Kafka", x.uuid, p, seq)
			case !m.poison && x.dead:
				w.fail("message %s (partition %d seq %d) was dead-lettered but is not poison", x.uuid, p, seq)
			}
			if s, dup := seqOf[x.uuid]; dup {
				w.fail("message %s has seqs %d and %d (sent twice)", x.uuid, s, seq)
			}
			seqOf[x.uuid] = seq
		}
		// 4.
		if r := w.db.cursors[cursorKey{group, topic, p}]; r == nil || r.seq != n {
			w.fail("partition %d: the cursor is not at its last seq %d", p, n)
		}
		if ps.lastSeq[p] != n {
			w.fail("partition %d: partitions.last_seq is %d, %d messages were committed", p, ps.lastSeq[p], n)
		}
	}
	if left := w.db.pendingLeft(); left > 0 {
		w.fail("%d messages left in pending", left)
	}
	// 3.
	for p, ms := range committed {
		for _, a := range ms {
			for _, b := range ms {
				if a.key == b.key && a.committed < b.inserted && seqOf[a.uuid] > 0 && seqOf[b.uuid] > 0 && seqOf[a.uuid] > seqOf[b.uuid] {
					w.fail("partition %d key %s: %s (committed before %s was inserted) has seq %d, after %d", p, a.key, a.uuid, b.uuid, seqOf[a.uuid], seqOf[b.uuid])
				}
			}
		}
	}
	uuids := make([]string, 0, len(byUUID))
	for u := range byUUID {
		uuids = append(uuids, u)
	}
	slices.Sort(uuids)
	for _, u := range uuids {
		if seqOf[u] == 0 {
			w.fail("message %s (partition %d) was committed and is neither in Kafka nor dead-lettered: LOST", u, byUUID[u].partition)
		}
	}
	res.Appended = len(seqOf)
}
