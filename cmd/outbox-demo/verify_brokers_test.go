package main

import (
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/partitioning"
)

// goodArrivals is what a consumer of goodLog's messages receives: each
// committed message once, in log order, with its outbox id; on Kafka, keyed
// and on the partition of its outbox partition.
func goodArrivals(t *testing.T, partitions int) ([]arrival, []logRow, []sent) {
	t.Helper()
	log, published := goodLog(t, partitions)
	ids := logIDs(log)
	var arrivals []arrival
	for _, r := range log {
		p, err := partitioning.Default().Partition(r.key, partitions)
		if err != nil {
			t.Fatal(err)
		}
		arrivals = append(arrivals, arrival{uuid: r.uuid, id: ids[r.uuid], partition: p, recordKey: r.key})
	}
	return arrivals, log, published
}

func TestBrokerChecksPassOnConsistentArrivals(t *testing.T) {
	const partitions = 4
	arrivals, log, published := goodArrivals(t, partitions)
	// A copy of the first message, at the end (after messages that followed
	// it): allowed on Kafka.
	withCopy := append(append([]arrival{}, arrivals...), arrivals[0])
	copies, bad := findCopies(withCopy)
	if len(copies) != 1 || len(bad) != 0 {
		t.Errorf("findCopies: %d copies, violations %q; want 1 copy, none", len(copies), bad)
	}
	for name, found := range map[string][]string{
		"all arrived":     checkAllArrived(withCopy, published),
		"known":           checkArrivedKnown(withCopy, byUUID(published), logIDs(log)),
		"order":           checkArrivalOrder(withCopy, byUUID(published)),
		"kafka placement": checkKafkaPlacement(withCopy, byUUID(published), partitions),
	} {
		if len(found) != 0 {
			t.Errorf("%s: unexpected violations %q", name, found)
		}
	}
}

func TestBrokerChecksFindViolations(t *testing.T) {
	const partitions = 1 // one partition: the log is in publishing order
	arrivals, log, published := goodArrivals(t, partitions)
	edited := func(edit func([]arrival) []arrival) []arrival {
		return edit(append([]arrival{}, arrivals...))
	}
	cases := map[string]func() []string{
		"missing": func() []string {
			return checkAllArrived(arrivals[1:], published)
		},
		"rolled back arrived": func() []string {
			a := edited(func(a []arrival) []arrival { return append(a, arrival{uuid: "x", id: "orders/0/9"}) })
			return checkArrivedKnown(a, byUUID(published), logIDs(log))
		},
		"unknown arrived": func() []string {
			a := edited(func(a []arrival) []arrival { return append(a, arrival{uuid: "zzz", id: "orders/0/9"}) })
			return checkArrivedKnown(a, byUUID(published), logIDs(log))
		},
		"wrong outbox id": func() []string {
			a := edited(func(a []arrival) []arrival { a[0].id = "orders/0/7"; return a })
			return checkArrivedKnown(a, byUUID(published), logIDs(log))
		},
		"versions out of order": func() []string {
			a := edited(func(a []arrival) []arrival { a[0], a[2] = a[2], a[0]; return a })
			return checkArrivalOrder(a, byUUID(published))
		},
		"index out of order": func() []string {
			a := edited(func(a []arrival) []arrival { a[0], a[1] = a[1], a[0]; return a })
			return checkArrivalOrder(a, byUUID(published))
		},
		"copy under another outbox id": func() []string {
			a := edited(func(a []arrival) []arrival {
				c := a[0]
				c.id = "orders/0/99"
				return append(a, c)
			})
			_, bad := findCopies(a)
			return bad
		},
		"copy where none may arrive": func() []string {
			copies, _ := findCopies(edited(func(a []arrival) []arrival { return append(a, a[1]) }))
			return copyViolations(copies)
		},
		"wrong record key": func() []string {
			a := edited(func(a []arrival) []arrival { a[0].recordKey = "2"; return a })
			return checkKafkaPlacement(a, byUUID(published), partitions)
		},
		"wrong Kafka partition": func() []string {
			a := edited(func(a []arrival) []arrival { a[0].partition = 1; return a })
			return checkKafkaPlacement(a, byUUID(published), partitions)
		},
	}
	for name, check := range cases {
		if found := check(); len(found) == 0 {
			t.Errorf("%s: no violation found", name)
		}
	}
}

func TestPercentile(t *testing.T) {
	var s deliveryStats
	if got := s.percentile(0.5); got != 0 {
		t.Errorf("no latencies: p50 %v", got)
	}
	for i := 1; i <= 200; i++ {
		s.latency = append(s.latency, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{0.5: 100 * time.Millisecond, 0.99: 198 * time.Millisecond, 1: 200 * time.Millisecond} {
		if got := s.percentile(p); got != want {
			t.Errorf("p%v = %v, want %v", p*100, got, want)
		}
	}
}
