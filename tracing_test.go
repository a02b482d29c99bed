package outbox_test

import (
	"context"
	"fmt"
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

// The sequencer pass span links to the spans of the messages it moved (the
// publish spans whose context their metadata carries), one link per
// distinct span, and counts the messages that carried trace context;
// untraced messages are moved too and make no link.
func TestSequencerPassSpanLinksToTheMessagesItMoved(t *testing.T) {
	tp, rec := recordTraces(t)
	e := newEnv(t)
	e.Register("orders", 2)
	e.Register("events", 1)
	traced := 0
	for i, topic := range []string{"orders", "orders", "events"} {
		ctx, app := tp.Tracer("app").Start(context.Background(), "request")
		msgs := []*message.Message{message.NewMessage(fmt.Sprint("a", i), []byte("x")), message.NewMessage(fmt.Sprint("b", i), []byte("x"))}
		for _, m := range msgs {
			m.SetContext(ctx)
		}
		e.Publish(topic, msgs...)
		traced += len(msgs)
		app.End()
	}
	e.Publish("orders", message.NewMessage("untraced", []byte("x")))
	if n := e.SequenceAll(); n != traced+1 {
		t.Fatalf("sequenced %d, want %d", n, traced+1)
	}

	want := map[trace.SpanID]bool{}
	for _, s := range rec.Ended() {
		if s.Name() == "orders publish" || s.Name() == "events publish" {
			want[s.SpanContext().SpanID()] = true
		}
	}
	if len(want) != 3 {
		t.Fatalf("%d publish spans, want 3", len(want))
	}
	pass := spanNamed(rec, "outbox sequencer pass")
	if pass == nil {
		t.Fatal("no sequencer pass span")
	}
	got := map[trace.SpanID]bool{}
	for _, l := range pass.Links() {
		got[l.SpanContext.SpanID()] = true
	}
	if len(pass.Links()) != len(want) || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pass span links %v, want one to each publish span %v", got, want)
	}
	if a, s := attr(pass, "outbox.traced"), attr(pass, "outbox.sequenced"); a != fmt.Sprint(traced) || s != fmt.Sprint(traced+1) {
		t.Errorf("pass span outbox.traced %s, outbox.sequenced %s; want %d and %d", a, s, traced, traced+1)
	}
}

// A pass that moves more traced messages than a span takes links links to
// the first MaxPassLinks (128) distinct spans and still counts them all.
func TestSequencerPassSpanLinksAreBounded(t *testing.T) {
	tp, rec := recordTraces(t)
	e := newEnv(t)
	e.Register("orders", 4)
	const publishes = 150
	first := map[trace.SpanID]bool{}
	for i := range publishes {
		ctx, app := tp.Tracer("app").Start(context.Background(), "request")
		m := message.NewMessage(fmt.Sprint("m", i), []byte("x"))
		m.SetContext(ctx)
		e.Publish("orders", m)
		app.End()
	}
	for _, s := range rec.Ended() {
		if s.Name() == "orders publish" && len(first) < 128 {
			first[s.SpanContext().SpanID()] = true
		}
	}
	if n := e.SequenceAll(); n != publishes {
		t.Fatalf("sequenced %d, want %d", n, publishes)
	}
	pass := spanNamed(rec, "outbox sequencer pass")
	if pass == nil {
		t.Fatal("no sequencer pass span")
	}
	if n := len(pass.Links()); n != 128 {
		t.Fatalf("pass span has %d links, want 128", n)
	}
	for _, l := range pass.Links() {
		if !first[l.SpanContext.SpanID()] {
			t.Fatalf("pass span links %s, not one of the first 128 messages' spans", l.SpanContext.SpanID())
		}
	}
	if a := attr(pass, "outbox.traced"); a != fmt.Sprint(publishes) {
		t.Errorf("pass span outbox.traced = %s, want %d", a, publishes)
	}
}
