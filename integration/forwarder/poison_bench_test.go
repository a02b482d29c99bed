package forwarder_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// BenchmarkForwarderPoison measures what broker-refused poison costs the
// forwarder: 16 publishers, each paced at 100 transactions of one message
// per second (1,600 msg/s in all, 3 s), write 4,800 keyed messages (1,000
// keys, 16 partitions, 200 B) into the outbox while a forwarder relays them
// to a Kafka topic (the in-process kfake broker, or the cluster of
// OUTBOX_TEST_KAFKA_BROKERS: see kafkatest) whose max.message.bytes (64
// KiB) refuses 1% of them (100 KiB). It reports the largest lag seen
// (messages committed but not yet forwarded or dead-lettered, sampled every
// 10 ms) and the drain time (from the last commit until the lag is 0), with and without
// poison, side by side: run with -benchtime=1x.
func BenchmarkForwarderPoison(b *testing.B) {
	for _, poison := range []int{0, 1} {
		b.Run(fmt.Sprintf("poison=%d%%", poison), func(b *testing.B) {
			for range b.N {
				maxLag, drain := runPoisonLoad(b, poison)
				b.ReportMetric(float64(maxLag), "max-lag-msgs")
				b.ReportMetric(drain.Seconds()*1000, "drain-ms")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

func runPoisonLoad(b *testing.B, poisonPercent int) (maxLag int64, drain time.Duration) {
	const (
		publishers = 16
		perPub     = 300
		partitions = 16
		keys       = 1000
	)
	ctx := context.Background()
	bundle := outboxtest.Setup(b)
	bundle.Register("orders", partitions)
	pool, schema := bundle.Pool, bundle.Schema
	kc := kafkatest.New(b)
	kt := kc.Topic(b, "orders", partitions, map[string]string{"max.message.bytes": strconv.Itoa(64 << 10)})
	target, err := kafka.NewTarget(kafka.Config{Brokers: kc.Brokers}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer target.Close()
	var rejected sync.Map
	fwd, err := forwarder.NewForwarder(forwarder.Config{
		Subscriber: outbox.SubscriberConfig{Schema: schema, Pool: pool, Tuning: adaptive.Default(), CloseTimeout: time.Second,
			RejectHandler: outboxtype.RejectHandlerFunc(func(_ context.Context, _ pgx.Tx, m outboxtype.RejectedMessage) error {
				rejected.Store(m.UUID, true)
				return nil
			})},
		Topics:      []string{"orders"},
		Target:      target,
		TargetTopic: func(string) string { return kt },
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- fwd.Run(ctx) }()
	defer func() {
		_ = fwd.Close()
		<-runDone
	}()
	lagSQL := `SELECT (SELECT count(*) FROM ` + schema + `.pending) +
		coalesce((SELECT sum(p.last_seq - coalesce(c.seq, 0)) FROM ` + schema + `.partitions p
			LEFT JOIN ` + schema + `.cursors c ON c.topic = p.topic AND c.partition = p.partition), 0)`
	lag := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, lagSQL).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}

	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: pool, OwnTransaction: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for i := range perPub {
				<-tick.C
				n := p*perPub + i
				m := message.NewMessage("m"+strconv.Itoa(n), make([]byte, 200))
				m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "key-"+strconv.Itoa(n%keys))
				if poisonPercent > 0 && n%(100/poisonPercent) == 50 {
					m.Payload = make([]byte, 100<<10)
				}
				if err := pub.Publish("orders", m); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	published := make(chan struct{})
	go func() { wg.Wait(); close(published) }()
	var lastCommit time.Time
sample:
	for {
		select {
		case <-published:
			lastCommit = time.Now()
			break sample
		case <-time.After(10 * time.Millisecond):
			maxLag = max(maxLag, lag())
		}
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		l := lag()
		maxLag = max(maxLag, l)
		if l == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("lag still %d after 5 minutes", l)
		}
		time.Sleep(5 * time.Millisecond)
	}
	drain = time.Since(lastCommit)
	b.StopTimer()
	want := 0
	if poisonPercent > 0 {
		want = publishers * perPub * poisonPercent / 100
	}
	n := 0
	rejected.Range(func(any, any) bool { n++; return true })
	if n != want {
		b.Fatalf("%d messages rejected, want %d", n, want)
	}
	return maxLag, drain
}
