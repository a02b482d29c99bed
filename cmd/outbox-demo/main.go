// Command outbox-demo runs the transactional outbox end to end, from
// transactions in PostgreSQL to consumers of Kafka and NATS JetStream, and
// checks its guarantees along the way.
//
//	go run ./cmd/outbox-demo
//
// It needs no setup beyond Go and the PostgreSQL server binaries (Debian:
// apt-get install postgresql): it starts its own PostgreSQL server in a
// temporary directory, Kafka in-process (franz-go's kfake) and an embedded
// NATS server with JetStream, and stops and removes them all when done,
// also on Ctrl-C.
//
// The demo runs in stages, one file each:
//
//  1. database.go: start PostgreSQL, migrate the outbox, register topic
//     "orders" and create an "orders" table: the aggregates whose changes
//     are published;
//  2. brokers.go: start Kafka with topic "orders" (as many partitions as
//     the outbox topic) and NATS with a JetStream stream "orders";
//  3. forward.go: start a Sequencer and two Forwarders over the outbox
//     topic, each its own consumer group: one to Kafka, one to JetStream;
//  4. consume.go: start the broker-side consumers, a watermill-kafka
//     subscriber and a watermill-nats JetStream subscriber, which record
//     each message with its arrival time;
//  5. publish.go: concurrent publishers each run transactions that update
//     one order row (which locks it) and publish 1–5 messages keyed by the
//     order's id through the context-bound Publisher, then commit — or roll
//     back, some of the time — and note when Commit returned. Everything
//     else works meanwhile; progress.go prints a line every second;
//  6. await.go: wait until the sequencer has sequenced every committed
//     message, and until both consumers have received every one;
//  7. verify.go: check the database: every committed message is in the log
//     exactly once and no rolled-back one is; each partition's seq runs
//     1..n without gaps; each key sits in its murmur2 partition and its
//     messages follow the order of its transactions along seq;
//  8. verify_brokers.go: check what the consumers received: every committed
//     message and nothing else, under the outbox id of its log row; per
//     key, first arrivals in version order; copies (at-least-once) carry
//     the outbox id of an earlier arrival, and on NATS there are none, as
//     the server drops them by Nats-Msg-Id; Kafka records sit on the
//     partition numbered like their outbox partition;
//  9. summary.go: counts, publish and end-to-end rates, and the latency
//     from commit to arrival at each broker's consumer (p50, p99, max).
//
// It prints "OK" and exits 0, or lists the violations and exits 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// topic is the outbox topic the demo publishes to.
const topic = "orders"

// config holds the command-line settings.
type config struct {
	messages   int
	publishers int
	partitions int
	keys       int
	rollback   float64
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("outbox-demo", flag.ContinueOnError)
	fs.IntVar(&c.messages, "messages", 20000, "messages to publish, counting those in rolled-back transactions")
	fs.IntVar(&c.publishers, "publishers", 8, "concurrent publishers")
	fs.IntVar(&c.partitions, "partitions", 16, "partitions of topic \""+topic+"\"")
	fs.IntVar(&c.keys, "keys", 200, "orders, i.e. distinct partition keys")
	fs.Float64Var(&c.rollback, "rollback", 0.1, "fraction of transactions rolled back")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case c.messages < 1:
		return c, errors.New("-messages must be at least 1")
	case c.publishers < 1:
		return c, errors.New("-publishers must be at least 1")
	case c.partitions < 1 || c.partitions > 1024:
		return c, errors.New("-partitions must be in 1..1024")
	case c.keys < 1:
		return c, errors.New("-keys must be at least 1")
	case c.rollback < 0 || c.rollback > 1:
		return c, errors.New("-rollback must be in 0..1")
	}
	return c, nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1 // a stage failed or verification found violations
	exitUsage       = 2
	exitInterrupted = 130
)

// stage is one step of the demo.
type stage struct {
	title string
	run   func(ctx context.Context) error
}

// run runs the demo with the command-line args, writes its report to out
// and the log (warnings and errors) to logOut, and returns the exit code.
func run(args []string, out, logOut io.Writer) int {
	cfg, err := parseFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintln(logOut, "outbox-demo:", err)
		return exitUsage
	}
	// pgcluster itself stops the server and exits (status 130) on
	// SIGINT/SIGTERM; this context lets the stages stop early too.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	d := newDemo(cfg, out, logOut)
	defer d.close()
	// From the interrupt on, everything fails on its way down: keep quiet.
	context.AfterFunc(ctx, func() { d.quiet.Store(true) })
	fmt.Fprintf(out, "outbox-demo: %d messages, %d publishers, %d partitions, %d keys, %.0f%% rollbacks\n",
		cfg.messages, cfg.publishers, cfg.partitions, cfg.keys, 100*cfg.rollback)

	start := time.Now()
	for _, s := range d.stages() {
		fmt.Fprintf(out, "\n== %s\n", s.title)
		err := s.run(ctx)
		switch {
		case ctx.Err() != nil:
			fmt.Fprintln(out, "interrupted")
			d.awaitSignalExit()
			return exitInterrupted
		case errors.Is(err, errViolations):
			fmt.Fprintf(out, "\nFAILED: %d violation(s) (%s)\n", d.violations.total(), time.Since(start).Round(time.Millisecond))
			return exitFailed
		case err != nil:
			fmt.Fprintf(out, "\nFAILED: %s: %v\n", s.title, err)
			return exitFailed
		}
	}
	fmt.Fprintf(out, "\nOK (%s)\n", time.Since(start).Round(time.Millisecond))
	return exitOK
}

// stages lists the demo's steps in order.
func (d *demo) stages() []stage {
	return []stage{
		{"start PostgreSQL", d.startDatabase},
		{"set up the outbox and the orders table", d.setUp},
		{"start Kafka and NATS JetStream", d.startBrokers},
		{"start the sequencer and the forwarders", d.startForwarding},
		{"start the brokers' consumers", d.startConsumers},
		{"publish (the sequencer, the forwarders and the consumers work meanwhile)", d.publish},
		{"wait until every committed message is sequenced", d.awaitSequenced},
		{"wait until both brokers' consumers have every committed message", d.awaitDelivered},
		{"verify the log against what was committed", d.verify},
		{"verify what the brokers' consumers received", d.verifyBrokers},
		{"summary", d.summarize},
	}
}
