package sim

import (
	"slices"
	"strconv"
	"strings"

	outbox "github.com/millrace/watermill-outbox"
)

// drained reports whether every committed message is appended and every
// partition's cursor stands at its last seq.
func (w *world) drained() bool {
	if w.sh.direct {
		return w.drainedPending()
	}
	if w.publishedCount() < w.sh.messages || !w.wal.appended() {
		return false
	}
	for p := range w.sh.partitions {
		r := w.db.cursors[cursorKey{group, topic, p}]
		if r == nil || r.seq != w.db.lastSeq(tp{topic, p}) {
			return false
		}
	}
	return true
}

// checkLeases checks that no partition is held by two live forwarders at
// once (each by its own clock, which here is the same).
func (w *world) checkLeases() {
	holder := map[int]string{}
	for _, in := range w.instances {
		if in.proc.dead.Load() {
			continue
		}
		var held []int
		if in.loop != nil {
			held = in.loop.Held()
		} else {
			held = in.mgr.Held()
		}
		for _, p := range held {
			if h, ok := holder[p]; ok {
				w.fail("partition %d is held by %s and %s at once (at %v)", p, h, in.name, w.now().Sub(w.start))
			}
			holder[p] = in.name
		}
	}
}

// kafkaCopy is a committed record of the outbox in Kafka.
type kafkaCopy struct {
	kafkaPartition int32
	offset         int64
	partition      int
	seq            int64
	key            string
}

// check verifies the invariants after the drain.
func (w *world) check() {
	res := w.res
	res.Published = w.publishedCount()
	if w.sh.direct {
		w.checkPending()
		return
	}
	// 1. The log holds every committed message once, in commit order per
	// partition.
	want := map[int][]pubMsg{}
	for _, t := range w.published {
		for _, m := range t.msgs {
			want[m.partition] = append(want[m.partition], m)
		}
	}
	type logged struct {
		partition int
		seq       int64
		poison    bool
		key       string
	}
	byUUID := map[string]logged{}
	for p := range w.sh.partitions {
		rows := w.db.log[tp{topic, p}]
		res.Appended += len(rows)
		if len(rows) != len(want[p]) {
			w.fail("partition %d: the log holds %d messages, %d were committed", p, len(rows), len(want[p]))
		}
		for i, r := range rows {
			if i < len(want[p]) && want[p][i].uuid != r.uuid {
				w.fail("partition %d seq %d: the log holds %s where commit order puts %s", p, r.seq, r.uuid, want[p][i].uuid)
			}
			if _, dup := byUUID[r.uuid]; dup {
				w.fail("message %s is in the log twice", r.uuid)
			}
			byUUID[r.uuid] = logged{p, r.seq, r.poison, r.key}
		}
	}
	// 2. Kafka's committed records: each outbox message at most once, in
	// seq order per outbox partition within each Kafka partition.
	copies := map[string][]kafkaCopy{}
	txnParts := map[*txn]map[int]bool{}
	for kp, part := range w.k.topics[topic] {
		last := map[int]int64{}
		for _, r := range part.committedRecords(0, int64(len(part.records))) {
			id, source := r.header(outbox.MetadataID), r.header(outbox.MetadataSource)
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
			if r.txn != nil {
				if txnParts[r.txn] == nil {
					txnParts[r.txn] = map[int]bool{}
				}
				txnParts[r.txn][p] = true
			}
			copies[id] = append(copies[id], kafkaCopy{kafkaPartition: int32(kp), offset: r.offset, partition: p, seq: seq, key: string(r.key)})
			res.InKafka++
		}
	}
	for _, ps := range txnParts {
		if len(ps) > 1 {
			res.Combined++
		}
	}
	// 2b. Upgraded from a version before writer records: a partition whose
	// writer became known was taken over, and the takeover fenced the old
	// per-partition producer (one InitProducerId at the start, one more
	// for the fence).
	if w.sh.legacy {
		for p := range w.sh.partitions {
			r := w.db.cursors[cursorKey{group, topic, p}]
			if r == nil || r.writerNull {
				continue
			}
			res.LegacyTakeovers++
			if n := w.k.inits[legacyID(p)]; n < 2 {
				w.fail("partition %d: writer %q recorded over an unknown writer without fencing the old per-partition producer %s (%d InitProducerId)", p, r.writer, legacyID(p), n)
			}
		}
	}
	// 3. Dead letters.
	dead := map[string]int{}
	for _, d := range w.db.dead {
		dead[d.uuid]++
	}
	res.Dead = len(dead)
	// 4. Every logged message: poison dead-lettered (not in Kafka), any
	// other in Kafka exactly once (not dead-lettered).
	uuids := make([]string, 0, len(byUUID))
	for u := range byUUID {
		uuids = append(uuids, u)
	}
	slices.Sort(uuids)
	for _, u := range uuids {
		l := byUUID[u]
		id := topic + "/" + strconv.Itoa(l.partition) + "/" + strconv.FormatInt(l.seq, 10)
		n := len(copies[id])
		switch {
		case l.poison && dead[u] == 0:
			w.fail("poison message %s (partition %d seq %d) was not dead-lettered (in Kafka %d times)", u, l.partition, l.seq, n)
		case l.poison && n > 0:
			w.fail("poison message %s (partition %d seq %d) is in Kafka %d times", u, l.partition, l.seq, n)
		case !l.poison && dead[u] > 0:
			w.fail("message %s (partition %d seq %d) was dead-lettered but is not poison", u, l.partition, l.seq)
		case !l.poison && n == 0:
			w.fail("message %s (partition %d seq %d) is LOST: not in any committed Kafka transaction, not dead-lettered, and the cursor is past it", u, l.partition, l.seq)
		case !l.poison && n > 1:
			w.fail("message %s (partition %d seq %d) is in Kafka %d times", u, l.partition, l.seq, n)
		}
		if n > 0 && copies[id][0].key != l.key {
			w.fail("message %s: Kafka's record has key %q, the outbox %q", u, copies[id][0].key, l.key)
		}
		if dead[u] > 1 {
			w.fail("message %s was dead-lettered %d times", u, dead[u])
		}
	}
}

// parseID splits an outbox_id "orders/partition/seq".
func parseID(id string) (partition int, seq int64, ok bool) {
	rest, ok := strings.CutPrefix(id, topic+"/")
	if !ok {
		return 0, 0, false
	}
	ps, ss, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, 0, false
	}
	p, err1 := strconv.Atoi(ps)
	s, err2 := strconv.ParseInt(ss, 10, 64)
	return p, s, err1 == nil && err2 == nil && s > 0
}
