package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
)

// arrival is a message as a broker-side consumer received it.
type arrival struct {
	uuid      string
	id        string // outbox.MetadataID: "topic/partition/seq", the same on every copy
	at        time.Time
	partition int    // the Kafka partition it was read from; -1 on NATS
	recordKey string // the Kafka record key; "" on NATS
}

// received collects what one broker's consumer got, in arrival order.
// Each Kafka partition is read by one goroutine that takes a message only
// after the previous one was acked, and a key lives in one partition, so
// the arrivals of a key are in the order the partition holds them.
type received struct {
	broker string
	unique atomic.Int64 // distinct outbox ids, for the progress line

	mu       sync.Mutex
	arrivals []arrival
	ids      map[string]bool
}

func newReceived(broker string) *received {
	return &received{broker: broker, ids: map[string]bool{}}
}

func (r *received) add(a arrival) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.arrivals = append(r.arrivals, a)
	if !r.ids[a.id] {
		r.ids[a.id] = true
		r.unique.Add(1)
	}
}

// snapshot returns the arrivals so far.
func (r *received) snapshot() []arrival {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]arrival(nil), r.arrivals...)
}

// startConsumers subscribes to both brokers as ordinary Watermill
// applications would: watermill-kafka's subscriber reads every partition of
// the Kafka topic from the oldest offset, watermill-nats's JetStream
// subscriber reads the stream. Every message is recorded with the time it
// arrived, then acked.
func (d *demo) startConsumers(ctx context.Context) error {
	d.kafkaIn, d.natsIn = newReceived("Kafka"), newReceived("NATS")

	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.IsolationLevel = sarama.ReadCommitted // the forwarder writes in Kafka transactions
	kafkaSub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               d.brokers.kafkaAddrs,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ReconnectRetrySleep:   200 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	if err := d.consume(ctx, kafkaSub, d.kafkaIn, func(m *message.Message) arrival {
		p, _ := kafka.MessagePartitionFromCtx(m.Context())
		key, _ := kafka.MessageKeyFromCtx(m.Context())
		return arrival{partition: int(p), recordKey: string(key)}
	}); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}

	// AckAsync: an ack is sent without waiting for the server's answer, so
	// that acks do not hold the consumer back (a lost ack would show as a
	// redelivered copy, which the check would report).
	natsSub, err := wmjs.NewSubscriber(wmjs.SubscriberConfig{URL: d.brokers.natsURL, Logger: watermill.NopLogger{}, AckAsync: true})
	if err != nil {
		return err
	}
	if err := d.consume(ctx, natsSub, d.natsIn, func(*message.Message) arrival {
		return arrival{partition: -1}
	}); err != nil {
		return fmt.Errorf("NATS: %w", err)
	}
	fmt.Fprintf(d.out, "   watermill-kafka subscriber on Kafka topic %q (all partitions, from the oldest offset)\n", topic)
	fmt.Fprintf(d.out, "   watermill-nats JetStream subscriber on stream %q\n", topic)
	return nil
}

// consume subscribes sub to the topic and records each message in r until
// the demo ends; describe fills in the broker-specific fields.
func (d *demo) consume(ctx context.Context, sub message.Subscriber, r *received, describe func(*message.Message) arrival) error {
	subCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	msgs, err := sub.Subscribe(subCtx, topic)
	if err != nil {
		cancel()
		_ = sub.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			at := time.Now()
			a := describe(m)
			a.uuid, a.id, a.at = m.UUID, m.Metadata.Get(outbox.MetadataID), at
			r.add(a)
			m.Ack()
		}
	}()
	d.onClose(func() {
		cancel()
		_ = sub.Close()
		<-done
	})
	return nil
}
