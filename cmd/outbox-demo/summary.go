package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// summarize prints the totals, the rates and, per broker, the latency from
// commit to arrival at its consumer; it reports the violations found by
// the checks.
func (d *demo) summarize(context.Context) error {
	c := &d.published.counts
	published := len(d.published.messages)
	fmt.Fprintf(d.out, "   published    %6d messages in %5d transactions in %s: %.0f msg/s\n",
		published, c.committedTx.Load()+c.rolledBackTx.Load(), d.published.elapsed.Round(time.Millisecond),
		float64(published)/d.published.elapsed.Seconds())
	fmt.Fprintf(d.out, "   committed    %6d messages in %5d transactions\n", c.committedMsgs.Load(), c.committedTx.Load())
	fmt.Fprintf(d.out, "   rolled back  %6d messages in %5d transactions\n", c.rolledBackMsgs.Load(), c.rolledBackTx.Load())
	fmt.Fprintf(d.out, "   sequenced    %6d messages (in the log)\n\n", len(d.log))

	const format = "   %-6s  %9s  %8s  %6s  %11s  %11s  %11s  %11s\n"
	fmt.Fprintf(d.out, format, "broker", "forwarded", "received", "copies", "end to end", "p50 latency", "p99 latency", "max latency")
	for _, b := range []struct {
		in  *received
		fwd *runningForwarder
	}{{d.kafkaIn, d.forwarded.kafka}, {d.natsIn, d.forwarded.nats}} {
		s := d.deliveryStats(b.in.snapshot())
		fmt.Fprintf(d.out, format, b.in.broker, fmt.Sprint(b.fwd.Stats().Messages), fmt.Sprint(s.arrivals),
			fmt.Sprint(s.arrivals-s.messages), fmt.Sprintf("%.0f msg/s", s.rate),
			ms(s.percentile(0.50)), ms(s.percentile(0.99)), ms(s.percentile(1)))
	}
	fmt.Fprintln(d.out, "   (end to end: committed messages per second from the start of publishing to the last arrival;")
	fmt.Fprintln(d.out, "    latency: from the publisher's Commit returning to the first arrival at the broker's consumer)")
	if d.violations.total() > 0 {
		return errViolations
	}
	return nil
}

// deliveryStats describes the arrivals at one broker's consumer.
type deliveryStats struct {
	arrivals int             // including copies (and unknown messages)
	messages int             // distinct committed messages that arrived
	latency  []time.Duration // commit → first arrival, ascending
	rate     float64         // messages per second, from the start of publishing to the last first arrival
}

func (d *demo) deliveryStats(arrivals []arrival) deliveryStats {
	committedAt := make(map[string]time.Time, len(d.published.messages))
	for _, m := range d.published.messages {
		if m.committed {
			committedAt[m.uuid] = m.committedAt
		}
	}
	s := deliveryStats{arrivals: len(arrivals)}
	var last time.Time
	for _, a := range arrivals {
		at, ok := committedAt[a.uuid]
		if !ok {
			continue // unknown, rolled back or a copy
		}
		delete(committedAt, a.uuid)
		s.messages++
		// A message can be visible to the sequencer a moment before the
		// publisher's Commit call returns: count that as no latency.
		s.latency = append(s.latency, max(0, a.at.Sub(at)))
		if a.at.After(last) {
			last = a.at
		}
	}
	slices.Sort(s.latency)
	if s.messages > 0 {
		s.rate = float64(s.messages) / last.Sub(d.publishStart).Seconds()
	}
	return s
}

// percentile returns the nearest-rank percentile p (0 < p <= 1) of the
// latencies.
func (s deliveryStats) percentile(p float64) time.Duration {
	if len(s.latency) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(s.latency))))
	return s.latency[min(max(rank, 1), len(s.latency))-1]
}

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}
