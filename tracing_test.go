package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// recordTraces routes the outbox's spans to an in-memory recorder until the
// test ends.
func recordTraces(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	outbox.ConfigureTracing(tp, nil)
	t.Cleanup(func() {
		outbox.ConfigureTracing(nil, nil)
		_ = tp.Shutdown(context.Background())
	})
	return tp, rec
}

func spanNamed(rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	for _, s := range rec.Ended() {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if kv.Key == attribute.Key(key) {
			return kv.Value.String()
		}
	}
	return ""
}

// One trace follows a message from the handler that published it to the
// handler that received it: publish span (child of the publisher's span,
// its context in the metadata as traceparent), process span (child of the
// publish span, in the handler's msg.Context()), and a span for the
// sequencer pass that moved it.
func TestTraceFollowsAMessageFromPublishToTheHandler(t *testing.T) {
	tp, rec := recordTraces(t)
	e := newEnv(t)
	e.Register("orders", 2)
	ctx, app := tp.Tracer("app").Start(context.Background(), "place order")
	msg := message.NewMessage("m1", []byte("x"))
	msg.SetContext(ctx)
	e.Publish("orders", msg)
	app.End()
	if msg.Metadata.Get("traceparent") == "" {
		t.Fatalf("no traceparent in the metadata: %v", msg.Metadata)
	}
	e.SequenceAll()

	sub := e.Subscriber("g", nil)
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-msgs:
		sc := trace.SpanContextFromContext(got.Context())
		if sc.TraceID() != app.SpanContext().TraceID() {
			t.Fatalf("the handler's context is in trace %s, the publisher's is %s", sc.TraceID(), app.SpanContext().TraceID())
		}
		got.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}

	outboxtest.WaitFor(t, "the process span", 30*time.Second, func() bool { return spanNamed(rec, "orders process") != nil })
	publish, process := spanNamed(rec, "orders publish"), spanNamed(rec, "orders process")
	if publish == nil {
		t.Fatal("no publish span")
	}
	if publish.Parent().SpanID() != app.SpanContext().SpanID() || publish.SpanKind() != trace.SpanKindProducer {
		t.Errorf("publish span: parent %s, kind %s; want child of %s, producer", publish.Parent().SpanID(), publish.SpanKind(), app.SpanContext().SpanID())
	}
	if process.Parent().SpanID() != publish.SpanContext().SpanID() || process.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("process span: parent %s, kind %s; want child of the publish span %s, consumer", process.Parent().SpanID(), process.SpanKind(), publish.SpanContext().SpanID())
	}
	for key, want := range map[string]string{
		"messaging.system":              "watermill_outbox",
		"messaging.destination.name":    "orders",
		"messaging.consumer.group.name": "g",
		"messaging.operation.type":      "process",
	} {
		if got := attr(process, key); got != want {
			t.Errorf("process span %s = %q, want %q", key, got, want)
		}
	}
	if attr(process, "messaging.message.id") == "" {
		t.Error("process span without messaging.message.id")
	}
	if spanNamed(rec, "outbox sequencer pass") == nil {
		t.Error("no span for the sequencer pass")
	}
}

// Without a trace in the message's context, Publish adds nothing to the
// metadata and records no span.
func TestNoTraceNoMetadata(t *testing.T) {
	_, rec := recordTraces(t)
	e := newEnv(t)
	e.Register("orders", 1)
	msg := message.NewMessage("m1", []byte("x"))
	e.Publish("orders", msg)
	if v := msg.Metadata.Get("traceparent"); v != "" {
		t.Fatalf("traceparent %q without a trace", v)
	}
	if s := spanNamed(rec, "orders publish"); s != nil {
		t.Fatal("a publish span without a trace")
	}
}
