package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/partitioning"
)

// errViolations reports that verification found violations.
var errViolations = errors.New("verification failed")

// table returns the quoted name of an outbox table.
func table(name string) string {
	return pgx.Identifier{outbox.DefaultSchema, name}.Sanitize()
}

// logRow is a message read back from the outbox log.
type logRow struct {
	partition int
	seq       int64
	key       string
	uuid      string
	version   string // metadata, as stored
	index     string
}

// readLog loads the topic's log in (partition, seq) order, and each
// partition's high-water mark.
func (d *demo) readLog(ctx context.Context) ([]logRow, map[int]int64, error) {
	rows, err := d.pool.Query(ctx, `SELECT partition, seq, coalesce(partition_key, ''), uuid,
		coalesce(metadata->>$2, ''), coalesce(metadata->>$3, '')
		FROM `+table("log")+` WHERE topic = $1 ORDER BY partition, seq`, topic, versionMetadata, indexMetadata)
	if err != nil {
		return nil, nil, err
	}
	log, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (logRow, error) {
		var l logRow
		err := r.Scan(&l.partition, &l.seq, &l.key, &l.uuid, &l.version, &l.index)
		return l, err
	})
	if err != nil {
		return nil, nil, err
	}
	rows, err = d.pool.Query(ctx, "SELECT partition, last_seq FROM "+table("partitions")+" WHERE topic = $1", topic)
	if err != nil {
		return nil, nil, err
	}
	lastSeq := make(map[int]int64)
	var p int
	var s int64
	_, err = pgx.ForEachRow(rows, []any{&p, &s}, func() error {
		lastSeq[p] = s
		return nil
	})
	return log, lastSeq, err
}

// verify reads the log back and checks the outbox's guarantees, then
// prints what each partition holds.
func (d *demo) verify(ctx context.Context) error {
	log, lastSeq, err := d.readLog(ctx)
	if err != nil {
		return err
	}
	d.log = log
	byUUID := make(map[string]sent, len(d.published.messages))
	for _, m := range d.published.messages {
		byUUID[m.uuid] = m
	}
	d.runChecks([]check{
		{"every committed message is in the log exactly once", func() []string { return checkExactlyOnce(log, d.published.messages) }},
		{"no rolled-back or unknown message is in the log", func() []string { return checkOnlyCommitted(log, byUUID) }},
		{"each log row carries the key and version it was published with", func() []string { return checkContent(log, byUUID) }},
		{"seq runs 1..n without gaps in every partition", func() []string { return checkSeqs(log, lastSeq, d.cfg.partitions) }},
		{"each key is in its murmur2 partition", func() []string { return checkPartitions(log, d.cfg.partitions) }},
		{"each key's versions increase along seq", func() []string { return checkKeyOrder(log) }},
	})
	fmt.Fprintln(d.out)
	d.printPartitions()
	return nil
}

// check is one named verification; run returns the violations it found.
type check struct {
	name string
	run  func() []string
}

// runChecks runs the checks, prints "ok" or the violations of each, and
// adds the violations to d.violations.
func (d *demo) runChecks(checks []check) {
	for _, c := range checks {
		found := c.run()
		d.violations.add(c.name, found)
		if len(found) == 0 {
			fmt.Fprintf(d.out, "   ok    %s\n", c.name)
			continue
		}
		fmt.Fprintf(d.out, "   FAIL  %s: %d violation(s)\n", c.name, len(found))
		for i, v := range found {
			if i == maxListed {
				fmt.Fprintf(d.out, "           ... and %d more\n", len(found)-maxListed)
				break
			}
			fmt.Fprintf(d.out, "           %s\n", v)
		}
	}
}

// maxListed bounds the violations printed per check.
const maxListed = 10

// violations counts the violations found, per check.
type violations map[string]int

func (v *violations) add(check string, found []string) {
	if len(found) == 0 {
		return
	}
	if *v == nil {
		*v = make(violations)
	}
	(*v)[check] += len(found)
}

func (v violations) total() int {
	n := 0
	for _, c := range v {
		n += c
	}
	return n
}

func checkExactlyOnce(log []logRow, published []sent) []string {
	seen := make(map[string]int, len(log))
	for _, r := range log {
		seen[r.uuid]++
	}
	var out []string
	for _, m := range published {
		if n := seen[m.uuid]; m.committed && n != 1 {
			out = append(out, fmt.Sprintf("message %s (key %s, version %d) is in the log %d times", m.uuid, m.key, m.version, n))
		}
	}
	return out
}

func checkOnlyCommitted(log []logRow, byUUID map[string]sent) []string {
	var out []string
	for _, r := range log {
		m, ok := byUUID[r.uuid]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("partition %d seq %d: unknown message %s", r.partition, r.seq, r.uuid))
		case !m.committed:
			out = append(out, fmt.Sprintf("partition %d seq %d: message %s of a rolled-back transaction (key %s, version %d)", r.partition, r.seq, r.uuid, m.key, m.version))
		}
	}
	return out
}

func checkContent(log []logRow, byUUID map[string]sent) []string {
	var out []string
	for _, r := range log {
		m, ok := byUUID[r.uuid]
		if !ok {
			continue // reported by checkOnlyCommitted
		}
		if r.key != m.key || r.version != strconv.FormatInt(m.version, 10) || r.index != strconv.Itoa(m.index) {
			out = append(out, fmt.Sprintf("partition %d seq %d: key %q version %q index %q, published with key %q version %d index %d",
				r.partition, r.seq, r.key, r.version, r.index, m.key, m.version, m.index))
		}
	}
	return out
}

// checkSeqs expects log in (partition, seq) order.
func checkSeqs(log []logRow, lastSeq map[int]int64, partitions int) []string {
	var out []string
	count := make(map[int]int64)
	for _, r := range log {
		if r.partition < 0 || r.partition >= partitions {
			out = append(out, fmt.Sprintf("seq %d is in partition %d, outside 0..%d", r.seq, r.partition, partitions-1))
			continue
		}
		count[r.partition]++
		if want := count[r.partition]; r.seq != want {
			out = append(out, fmt.Sprintf("partition %d: seq %d where %d was due", r.partition, r.seq, want))
			count[r.partition] = r.seq // report each gap once
		}
	}
	for p := 0; p < partitions; p++ {
		if lastSeq[p] != count[p] {
			out = append(out, fmt.Sprintf("partition %d: last_seq %d but the log ends at %d", p, lastSeq[p], count[p]))
		}
	}
	return out
}

func checkPartitions(log []logRow, partitions int) []string {
	var out []string
	for _, r := range log {
		want, err := partitioning.Default().Partition(r.key, partitions)
		if err != nil || want != r.partition {
			out = append(out, fmt.Sprintf("key %q is in partition %d, murmur2 says %d (%v)", r.key, r.partition, want, err))
		}
	}
	return out
}

// checkKeyOrder expects log in (partition, seq) order: a key lives in one
// partition, so that is the order of its messages along seq.
func checkKeyOrder(log []logRow) []string {
	type position struct{ version, index int64 }
	last := make(map[string]position)
	var out []string
	for _, r := range log {
		v, err1 := strconv.ParseInt(r.version, 10, 64)
		i, err2 := strconv.ParseInt(r.index, 10, 64)
		if err1 != nil || err2 != nil {
			out = append(out, fmt.Sprintf("partition %d seq %d: unreadable version %q or index %q", r.partition, r.seq, r.version, r.index))
			continue
		}
		prev, seen := last[r.key]
		if seen && (v < prev.version || v == prev.version && i <= prev.index) {
			out = append(out, fmt.Sprintf("key %s: version %d.%d at partition %d seq %d comes after version %d.%d",
				r.key, v, i, r.partition, r.seq, prev.version, prev.index))
		}
		last[r.key] = position{v, i}
	}
	return out
}

// printPartitions prints messages, last seq and distinct keys per partition.
func (d *demo) printPartitions() {
	type summary struct {
		messages int
		lastSeq  int64
		keys     map[string]bool
	}
	parts := make([]summary, d.cfg.partitions)
	for _, r := range d.log {
		if r.partition < 0 || r.partition >= len(parts) {
			continue
		}
		s := &parts[r.partition]
		if s.keys == nil {
			s.keys = make(map[string]bool)
		}
		s.messages++
		s.lastSeq = max(s.lastSeq, r.seq)
		s.keys[r.key] = true
	}
	fmt.Fprintf(d.out, "   %9s  %8s  %8s  %4s\n", "partition", "messages", "last seq", "keys")
	for p, s := range parts {
		fmt.Fprintf(d.out, "   %9d  %8d  %8d  %4d\n", p, s.messages, s.lastSeq, len(s.keys))
	}
}
