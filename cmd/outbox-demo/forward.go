package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
)

// Consumer groups of the forwarders: each group sees every message of the
// outbox topic and has its own cursors.
const (
	kafkaGroup = "forward-to-kafka"
	natsGroup  = "forward-to-nats"
)

// forwarderPartitions is how many partitions a forwarder works on at the
// same time (its bulkhead); its pool has a few more connections for its
// LISTEN and its leases.
const forwarderPartitions = 8

// forwarders relay the outbox topic to the brokers, one per broker.
type forwarders struct {
	kafka, nats *runningForwarder
}

// runningForwarder is a Forwarder whose Run is under way.
type runningForwarder struct {
	*forwarder.Forwarder
	done chan struct{} // closed when Run returns
	err  error         // what Run returned, once done is closed
}

// failed returns the error Run stopped with, if it stopped.
func (f *runningForwarder) failed() error {
	select {
	case <-f.done:
		if f.err == nil {
			return fmt.Errorf("forwarder stopped")
		}
		return f.err
	default:
		return nil
	}
}

// startForwarding starts a Sequencer, which moves committed messages from
// pending into the log, and two Forwarders over the same outbox topic, one
// to Kafka and one to NATS JetStream. They run in the background until the
// demo ends; the publishers start next.
func (d *demo) startForwarding(ctx context.Context) error {
	if err := d.startSequencer(); err != nil {
		return err
	}
	kafkaTarget, err := kafka.NewTarget(kafka.Config{Brokers: d.brokers.kafkaAddrs}, d.logger)
	if err != nil {
		return err
	}
	d.onClose(func() { _ = kafkaTarget.Close() })
	natsTarget, err := jetstream.NewTarget(jetstream.Config{
		URL: d.brokers.natsURL, Options: []nats.Option{nats.ReconnectWait(200 * time.Millisecond)},
	}, d.logger)
	if err != nil {
		return err
	}
	d.onClose(func() { _ = natsTarget.Close() })

	if d.forwarded.kafka, err = d.startForwarder(ctx, kafkaGroup, kafkaTarget); err != nil {
		return err
	}
	if d.forwarded.nats, err = d.startForwarder(ctx, natsGroup, natsTarget); err != nil {
		return err
	}
	fmt.Fprintln(d.out, "   sequencer running")
	fmt.Fprintf(d.out, "   forwarder (consumer group %q) → Kafka topic %q\n", kafkaGroup, topic)
	fmt.Fprintf(d.out, "   forwarder (consumer group %q) → JetStream subject %q\n", natsGroup, topic)
	return nil
}

// startSequencer runs a Sequencer in the background until the demo ends.
func (d *demo) startSequencer() error {
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Pool: d.pool}, d.logger)
	if err != nil {
		return err
	}
	d.sequencer = seq
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Run returns nil when stopped; database errors are logged and retried.
		_ = seq.Run(context.Background())
	}()
	d.onClose(func() {
		_ = seq.Close()
		<-done
	})
	return nil
}

// startForwarder runs a Forwarder of consumer group group to target, with a
// pool of its own, as it would have in a process of its own.
func (d *demo) startForwarder(ctx context.Context, group string, target forwarder.Target) (*runningForwarder, error) {
	pool, err := d.connect(ctx, forwarderPartitions+4)
	if err != nil {
		return nil, err
	}
	// A message the broker refuses for good goes to the dead-letter store,
	// in the transaction that moves the cursor past it, and the partition
	// goes on. MaxAttempts stays at the forwarder's default
	// (outbox.RetryForever): a send that fails because the broker is down
	// is retried until it is back, never dead-lettered.
	deadLetters, err := deadletter.NewStore(deadletter.Config{Pool: pool}, d.logger)
	if err != nil {
		return nil, err
	}
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{
			Pool:          pool,
			ConsumerGroup: group,
			RejectHandler: deadLetters,
			// Every partition's worker may query at once: the pool has the
			// connections.
			Advanced: outbox.Advanced{MaxConcurrentPartitions: forwarderPartitions},
			// The demo's own Sequencer does the sequencing.
			DisableSequencer: true,
		},
		Topics: []string{topic}, // to the Kafka topic / NATS subject of the same name
		Target: target,
	}, d.logger)
	if err != nil {
		return nil, err
	}
	f := &runningForwarder{Forwarder: fwd, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.err = fwd.Run(context.Background()) // until Close
	}()
	d.onClose(func() {
		_ = fwd.Close()
		<-f.done
	})
	return f, nil
}
