package main

import (
	"strconv"
	"testing"

	"github.com/millrace/watermill-outbox/partitioning"
)

// goodLog is a consistent log of two keys and the messages it came from:
// key "1" has versions 1 (two messages) and 2, key "2" version 1; one
// rolled-back message of key "1" is not in the log.
func goodLog(t *testing.T, partitions int) ([]logRow, []sent) {
	t.Helper()
	published := []sent{
		{uuid: "a", key: "1", version: 1, index: 1, committed: true},
		{uuid: "b", key: "1", version: 1, index: 2, committed: true},
		{uuid: "x", key: "1", version: 2, index: 1, committed: false},
		{uuid: "c", key: "1", version: 2, index: 1, committed: true},
		{uuid: "d", key: "2", version: 1, index: 1, committed: true},
	}
	next := map[int]int64{}
	var log []logRow
	for _, m := range published {
		if !m.committed {
			continue
		}
		p, err := partitioning.Default().Partition(m.key, partitions)
		if err != nil {
			t.Fatal(err)
		}
		next[p]++
		log = append(log, logRow{partition: p, seq: next[p], key: m.key, uuid: m.uuid,
			version: strconv.FormatInt(m.version, 10), index: strconv.Itoa(m.index)})
	}
	// readLog returns (partition, seq) order.
	for i := 1; i < len(log); i++ {
		for j := i; j > 0 && log[j].partition < log[j-1].partition; j-- {
			log[j], log[j-1] = log[j-1], log[j]
		}
	}
	return log, published
}

func byUUID(published []sent) map[string]sent {
	m := make(map[string]sent)
	for _, s := range published {
		m[s.uuid] = s
	}
	return m
}

func lastSeqs(log []logRow) map[int]int64 {
	m := make(map[int]int64)
	for _, r := range log {
		m[r.partition] = max(m[r.partition], r.seq)
	}
	return m
}

func TestChecksPassOnAConsistentLog(t *testing.T) {
	const partitions = 4
	log, published := goodLog(t, partitions)
	for name, found := range map[string][]string{
		"exactly once":   checkExactlyOnce(log, published),
		"only committed": checkOnlyCommitted(log, byUUID(published)),
		"content":        checkContent(log, byUUID(published)),
		"seqs":           checkSeqs(log, lastSeqs(log), partitions),
		"partitions":     checkPartitions(log, partitions),
		"key order":      checkKeyOrder(log),
	} {
		if len(found) != 0 {
			t.Errorf("%s: unexpected violations %q", name, found)
		}
	}
}

func TestChecksFindViolations(t *testing.T) {
	const partitions = 1 // one partition: the log is in publishing order
	log, published := goodLog(t, partitions)
	cases := map[string]func() []string{
		"duplicate": func() []string {
			return checkExactlyOnce(append(log, log[0]), published)
		},
		"missing": func() []string {
			return checkExactlyOnce(log[1:], published)
		},
		"rolled back in log": func() []string {
			bad := append([]logRow{}, log...)
			bad[2].uuid = "x"
			return checkOnlyCommitted(bad, byUUID(published))
		},
		"unknown in log": func() []string {
			bad := append([]logRow{}, log...)
			bad[0].uuid = "zzz"
			return checkOnlyCommitted(bad, byUUID(published))
		},
		"wrong version": func() []string {
			bad := append([]logRow{}, log...)
			bad[0].version = "7"
			return checkContent(bad, byUUID(published))
		},
		"gap": func() []string {
			bad := append([]logRow{}, log...)
			bad[1].seq = 3
			bad[2].seq = 4
			bad[3].seq = 5
			return checkSeqs(bad, lastSeqs(bad), partitions)
		},
		"last_seq behind": func() []string {
			return checkSeqs(log, map[int]int64{0: 2}, partitions)
		},
		"wrong partition": func() []string {
			return checkPartitions(log, 2) // placed for 1 partition, checked for 2
		},
		"versions out of order": func() []string {
			bad := append([]logRow{}, log...)
			bad[0].version, bad[2].version = bad[2].version, bad[0].version
			return checkKeyOrder(bad)
		},
		"index out of order": func() []string {
			bad := append([]logRow{}, log...)
			bad[0].index, bad[1].index = bad[1].index, bad[0].index
			return checkKeyOrder(bad)
		},
	}
	for name, check := range cases {
		if found := check(); len(found) == 0 {
			t.Errorf("%s: no violation found", name)
		}
	}
}
