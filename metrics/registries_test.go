package metrics_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/metrics"
)

// Enable on a second registry does not stop the first: every event reaches
// both. Disable turns off its own registry only (the other keeps
// counting), and a second Disable changes nothing.
func TestSeveralRegistriesEachGetEveryEventAndDisableOnlyTheirOwn(t *testing.T) {
	b := outboxtest.Setup(t)
	b.Register("orders", 1)
	published := func(reg *prometheus.Registry) float64 {
		return value(t, reg, "outbox_published_messages_total", "topic", "orders")
	}

	first, second := prometheus.NewRegistry(), prometheus.NewRegistry()
	m1, err := metrics.Enable(metrics.Config{Registerer: first})
	if err != nil {
		t.Fatal(err)
	}
	defer m1.Disable()
	m2, err := metrics.Enable(metrics.Config{Registerer: second, Pool: b.Pool, Schema: b.Schema})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Disable()

	b.Publish("orders", message.NewMessage("m1", []byte("x")))
	if p1, p2 := published(first), published(second); p1 != 1 || p2 != 1 {
		t.Fatalf("published after enabling two registries: first %v, second %v; want 1 and 1", p1, p2)
	}

	m1.Disable()
	b.Publish("orders", message.NewMessage("m2", []byte("x")))
	if p1, p2 := published(first), published(second); p1 != -1 || p2 != 2 {
		t.Fatalf("published after disabling the first: first %v (want -1: unregistered), second %v (want 2)", p1, p2)
	}
	m1.Disable() // again: nothing changes
	b.Publish("orders", message.NewMessage("m3", []byte("x")))
	if p2 := published(second); p2 != 3 {
		t.Fatalf("published on the second after disabling the first twice: %v, want 3", p2)
	}
	if !observe.Enabled() {
		t.Fatal("no observer installed while the second registry is enabled")
	}

	// The first can be enabled again, next to the second.
	m1, err = metrics.Enable(metrics.Config{Registerer: first})
	if err != nil {
		t.Fatal(err)
	}
	b.Publish("orders", message.NewMessage("m4", []byte("x")))
	if p1, p2 := published(first), published(second); p1 != 1 || p2 != 4 {
		t.Fatalf("published after enabling the first again: first %v, second %v; want 1 and 4", p1, p2)
	}
	m1.Disable()
	m2.Disable()
	if observe.Enabled() {
		t.Fatal("an observer is still installed after every registry was disabled")
	}
}
