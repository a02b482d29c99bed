package forwarder_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// The trace context of Publish reaches Kafka: the record's traceparent
// header, read by a watermill-kafka subscriber, is in the publisher's
// trace, and the forwarder's send span links to the message's span.
func TestTraceReachesTheKafkaRecordHeaders(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	outbox.ConfigureTracing(tp, nil)
	t.Cleanup(func() { outbox.ConfigureTracing(nil, nil); _ = tp.Shutdown(context.Background()) })

	e := fwdtest.NewEnv(t)
	e.Register("orders", 1)
	kc := kafkatest.New(t)
	kt := kc.Topic(t, "orders", 1, nil)
	fwdtest.StartForwarder(t, e, nil, newKafkaTarget(t, kc, false), []string{"orders"}, to(kt, nil))

	ctx, app := tp.Tracer("app").Start(context.Background(), "place order")
	msg := message.NewMessage("traced", []byte("x"))
	msg.SetContext(ctx)
	e.Publish("orders", msg)
	app.End()

	r := &fwdtest.Received{}
	kc.Consume(t, kt, r)
	outboxtest.WaitFor(t, "the record on Kafka", time.Minute, func() bool { return r.Distinct() == 1 })
	header := r.Messages()[0].Metadata
	carrier := propagation.MapCarrier(header)
	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	if !got.IsValid() || got.TraceID() != app.SpanContext().TraceID() {
		t.Fatalf("record header traceparent %q: trace %s, want the publisher's %s", header["traceparent"], got.TraceID(), app.SpanContext().TraceID())
	}
	outboxtest.WaitFor(t, "the send span", 30*time.Second, func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == kt+" send" && len(s.Links()) == 1 && s.Links()[0].SpanContext.TraceID() == app.SpanContext().TraceID() {
				return true
			}
		}
		return false
	})
}
