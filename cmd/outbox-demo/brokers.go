package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
)

// dedupWindow is the JetStream stream's duplicate window: within it the
// server drops a message whose Nats-Msg-Id (the outbox id) it stored.
const dedupWindow = 2 * time.Minute

// brokers are the two message brokers the outbox forwards to, both in this
// process: Kafka is franz-go's kfake, NATS an embedded nats-server with
// JetStream.
type brokers struct {
	kafka      *kfake.Cluster
	kafkaAddrs []string
	nats       *server.Server
	natsURL    string
	natsStore  string // JetStream's store directory, removed on stop
}

// startBrokers starts Kafka with topic "orders" (as many partitions as the
// outbox topic: a key lands on the same partition number in both) and
// NATS with a JetStream stream over subject "orders".
func (d *demo) startBrokers(ctx context.Context) error {
	b := &d.brokers
	var once sync.Once
	stop := func() { once.Do(b.stop) }
	// On Ctrl-C, stop them at once: pgcluster's signal handler exits the
	// process as soon as PostgreSQL is gone, and the NATS store directory
	// must be removed before.
	cancelAfter := context.AfterFunc(ctx, stop)
	d.onClose(func() { cancelAfter(); stop() })

	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(d.cfg.partitions), topic))
	if err != nil {
		return fmt.Errorf("kfake: %w", err)
	}
	b.kafka, b.kafkaAddrs = kafka, kafka.ListenAddrs()
	fmt.Fprintf(d.out, "   Kafka (kfake, in-process) on %v: topic %q with %d partitions\n", b.kafkaAddrs, topic, d.cfg.partitions)

	if b.natsStore, err = os.MkdirTemp("", "outbox-demo-nats-"); err != nil {
		return err
	}
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, // any free port
		JetStream: true, StoreDir: b.natsStore,
		NoLog: true, NoSigs: true, // the demo handles signals
	})
	if err != nil {
		return fmt.Errorf("nats-server: %w", err)
	}
	b.nats = ns
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		return fmt.Errorf("nats-server not ready after 10s")
	}
	b.natsURL = ns.ClientURL()
	if err := createStream(ctx, b.natsURL); err != nil {
		return fmt.Errorf("create JetStream stream: %w", err)
	}
	fmt.Fprintf(d.out, "   NATS (embedded nats-server) on %s: JetStream stream %q over subject %q, duplicate window %s\n",
		b.natsURL, topic, topic, dedupWindow)
	return nil
}

// createStream creates the stream the forwarder publishes to. The target
// creates no streams; watermill-nats's subscriber reads the stream named
// like the topic.
func createStream(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: topic, Subjects: []string{topic}, Storage: jetstream.FileStorage, Duplicates: dedupWindow,
	})
	return err
}

// stop shuts both brokers down and removes the NATS store.
func (b *brokers) stop() {
	if b.nats != nil {
		b.nats.Shutdown()
		b.nats.WaitForShutdown()
	}
	if b.natsStore != "" {
		_ = os.RemoveAll(b.natsStore)
	}
	if b.kafka != nil {
		b.kafka.Close()
	}
}
