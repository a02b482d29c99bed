package chaos

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
)

// The children's Kafka clients — the forwarder's franz-go options and the
// inbox consumer's sarama configuration, as RunChild builds them — reach
// every broker through the run's proxies, the addresses the brokers
// advertise in their metadata included, as a real cluster needs. Their
// seed is an address that differs from every advertised one (a front
// proxy, as a real cluster's bootstrap address often is): with the
// advertised addresses' proxies broken they fail, although a client that
// dialed those addresses itself would not; restored, they work again.
// Break (the chaos test's broker outage) cuts them off entirely, Restore
// brings them back, and an address the map lacks is refused, not dialed.
// On kfake or on the cluster of OUTBOX_TEST_KAFKA_BROKERS alike.
func TestChildClientsDialThroughBrokerProxies(t *testing.T) {
	c := kafkatest.New(t)
	front := kafkatest.NewProxy(t, c.Brokers[0])
	proxies := kafkatest.NewProxyMap(t, c, front.Addr())
	advertised := proxies.Advertised()
	for _, a := range advertised {
		if a == front.Addr() {
			t.Fatalf("the front proxy %s is an advertised address", a)
		}
	}
	topic := c.Topic(t, "chaos-proxies", 1, nil)
	cfg := ChildConfig{Name: "proxies", Brokers: []string{front.Addr()}, BrokerMap: proxies.Addrs()}
	logger := watermill.NopLogger{}

	produce := func() error {
		cl, err := kgo.NewClient(append(forwarderClientOptions(cfg, logger),
			kgo.SeedBrokers(cfg.Brokers...), kgo.DefaultProduceTopic(topic))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr()
	}
	newest := func() (int64, error) {
		cl, err := sarama.NewClient(cfg.Brokers, inboxSaramaConfig(cfg, logger))
		if err != nil {
			return 0, err
		}
		defer cl.Close()
		return cl.GetOffset(topic, 0, sarama.OffsetNewest)
	}
	works := func(step string, want int64) {
		t.Helper()
		if err := produce(); err != nil {
			t.Fatalf("%s: the forwarder's client cannot produce: %v", step, err)
		}
		got, err := newest()
		if err != nil || got != want {
			t.Fatalf("%s: the inbox's client sees offset %d (%v), want %d", step, got, err, want)
		}
	}
	fails := func(step string) {
		t.Helper()
		if err := produce(); err == nil {
			t.Fatalf("%s: the forwarder's client produced", step)
		}
		if got, err := newest(); err == nil {
			t.Fatalf("%s: the inbox's client read offset %d", step, got)
		}
	}

	works("through the proxies", 1)

	for _, a := range advertised {
		proxies.Proxy(a).Break()
	}
	fails("the advertised addresses' proxies broken")
	for _, a := range advertised {
		proxies.Proxy(a).Restore()
	}
	works("restored", 2)

	proxies.Break()
	fails("every proxy broken (an outage)")
	proxies.Restore()
	works("after the outage", 3)

	d := brokerDialer(cfg, logger)
	if conn, err := d.Dial("tcp", "broker-not-in-the-map.invalid:9092"); !errors.Is(err, kafkatest.ErrUnmapped) {
		if conn != nil {
			_ = conn.Close()
		}
		t.Fatalf("an address the map lacks: %v, want ErrUnmapped", err)
	}
}
