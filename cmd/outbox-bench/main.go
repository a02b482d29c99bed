// Command outbox-bench compares, in one process and on one machine, three
// ways of getting rows written in a transaction out to Kafka:
//
//	(a) ceiling: a plain multi-row INSERT of the same rows into a bare table
//	    (publishing only; nothing is forwarded);
//	(b) peer: watermill-sql v4's Publisher (default PostgreSQL schema
//	    adapter, inside the transaction) behind Watermill's
//	    components/forwarder, which relays to watermill-kafka's publisher;
//	(c) this project: the transactional outbox.Publisher, the Sequencer and
//	    forwarder.Forwarder with a KafkaTarget.
//
// It starts a throwaway durable PostgreSQL cluster (fsync and
// synchronous_commit on) and an in-process Kafka broker (franz-go's kfake),
// publishes the same workload with each system (-publishers goroutines,
// -per-tx messages per transaction) while its relay runs, and reports publish
// throughput, end-to-end throughput (from the first publish to the last
// message at the broker, counted from the broker's end offsets), CPU time of
// this process and the PostgreSQL server, and peak RSS of this process.
//
//	go run ./cmd/outbox-bench            # defaults: 200,000 messages, 100 and 1 per transaction
//	go run ./cmd/outbox-bench -smoke     # tiny sizes, for CI
//
// Results go to -out (default ./outbox-bench-results): results.json,
// results.md and throughput.png. See docs/comparison.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

type config struct {
	messages   int
	payload    int
	keys       int
	partitions int
	perTx      []int
	publishers int
	maxDrain   time.Duration
	out        string
	smoke      bool
	// outboxNotify leaves the outbox Publisher's NOTIFY on (the default).
	outboxNotify bool
}

func main() {
	var cfg config
	var perTx string
	flag.IntVar(&cfg.messages, "messages", 200000, "messages per system and per -per-tx value")
	flag.IntVar(&cfg.payload, "payload", 256, "payload bytes per message")
	flag.IntVar(&cfg.keys, "keys", 1000, "distinct partition keys")
	flag.IntVar(&cfg.partitions, "partitions", 16, "partitions of the outbox topic and of the Kafka topics")
	flag.StringVar(&perTx, "per-tx", "100,1", "messages per transaction; a comma-separated list runs each")
	flag.IntVar(&cfg.publishers, "publishers", 4, "concurrent publishers, one connection each")
	flag.DurationVar(&cfg.maxDrain, "max-drain", 15*time.Minute, "give up waiting for a system's messages at the broker after this long (the result is then marked incomplete)")
	flag.StringVar(&cfg.out, "out", "outbox-bench-results", "directory for results.json, results.md and throughput.png")
	flag.BoolVar(&cfg.outboxNotify, "outbox-notify", true, "(c): the Publisher sends NOTIFY to wake the Sequencer (its default); false leaves the Sequencer to its poll interval")
	flag.BoolVar(&cfg.smoke, "smoke", false, "tiny sizes (2,000 messages, 100 and 1 per transaction), finishes in seconds; for CI")
	flag.Parse()
	for _, s := range strings.Split(perTx, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "outbox-bench: bad -per-tx %q\n", s)
			os.Exit(2)
		}
		cfg.perTx = append(cfg.perTx, n)
	}
	if cfg.smoke {
		cfg.messages = 2000
		cfg.maxDrain = 20 * time.Second
		// -per-tx 1 at 2,000 messages takes about a second per system.
	}
	if cfg.messages < 1 || cfg.payload < 0 || cfg.keys < 1 || cfg.partitions < 1 || cfg.partitions > 1024 || cfg.publishers < 1 {
		fmt.Fprintln(os.Stderr, "outbox-bench: -messages, -keys, -publishers must be ≥ 1, -partitions 1..1024, -payload ≥ 0")
		os.Exit(2)
	}
	if err := run(context.Background(), cfg); err != nil {
		fmt.Fprintln(os.Stderr, "outbox-bench:", err)
		os.Exit(1)
	}
}
