package admin_test

import (
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// An operator's actions are spans, with the group, the topic and how much
// they changed, and a refused one carries its error: they show in the same
// traces as the deliveries they affect.
func TestAdminOperationsAreSpans(t *testing.T) {
	// Not parallel: the tracer provider is the process's.
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	outbox.ConfigureTracing(tp, nil)
	t.Cleanup(func() {
		outbox.ConfigureTracing(nil, nil)
		_ = tp.Shutdown(outboxtest.Ctx(t))
	})
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	e.Register("orders", 2)
	e.Exec(`INSERT INTO ` + e.Schema + `.cursors (group_name, topic, partition, seq) VALUES ('g', 'orders', 0, 0), ('g', 'orders', 1, 0)`)
	if _, err := e.admin.Pause(ctx, admin.Scope{Group: "g", Topic: "orders"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.Resume(ctx, admin.Scope{Group: "g", Topic: "orders", Partitions: []int{1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.ResetCursor(ctx, admin.Scope{Group: "g", Topic: "orders"}, admin.ToSeq(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.Pause(ctx, admin.Scope{Group: "g", Topic: "orders", Partitions: []int{7}}); err == nil {
		t.Fatal("a pause of a partition without a cursor was not refused")
	}
	type seen struct {
		name    string
		changed int64
		failed  bool
	}
	var got []seen
	for _, s := range rec.Ended() {
		var changed int64 = -1
		var group, topic string
		for _, a := range s.Attributes() {
			switch a.Key {
			case "messaging.outbox.admin.changed":
				changed = a.Value.AsInt64()
			case "messaging.consumer.group.name":
				group = a.Value.AsString()
			case "messaging.destination.name":
				topic = a.Value.AsString()
			}
		}
		if group != "g" || topic != "orders" {
			t.Errorf("span %s: group %q, topic %q; want g on orders", s.Name(), group, topic)
		}
		got = append(got, seen{s.Name(), changed, s.Status().Code == codes.Error})
	}
	want := []seen{{"outbox admin pause", 2, false}, {"outbox admin resume", 1, false}, {"outbox admin reset cursor", 2, false}, {"outbox admin pause", 0, true}}
	if len(got) != len(want) {
		t.Fatalf("spans %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("span %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}
