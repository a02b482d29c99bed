package observe

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracerName is the instrumentation scope of the outbox's spans.
const TracerName = "github.com/millrace/watermill-outbox"

// MessagingSystem is the messaging.system attribute of the outbox's spans.
const MessagingSystem = "watermill_outbox"

type tracing struct {
	provider   trace.TracerProvider          // nil: the global one
	propagator propagation.TextMapPropagator // nil: the global one, or W3C
}

var tracingConfig atomic.Pointer[tracing]

// SetTracing sets the tracer provider and propagator the outbox uses; nil
// for either means the OpenTelemetry global (and, for the propagator, W3C
// trace context and baggage when the global one propagates nothing).
func SetTracing(tp trace.TracerProvider, p propagation.TextMapPropagator) {
	tracingConfig.Store(&tracing{provider: tp, propagator: p})
}

func tracer() trace.Tracer {
	if t := tracingConfig.Load(); t != nil && t.provider != nil {
		return t.provider.Tracer(TracerName)
	}
	return otel.GetTracerProvider().Tracer(TracerName)
}

var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// propagator returns the propagator to use, and whether it is the W3C
// default (whose fields are known: traceparent, tracestate, baggage).
func propagator() (propagation.TextMapPropagator, bool) {
	if t := tracingConfig.Load(); t != nil && t.propagator != nil {
		return t.propagator, false
	}
	if p := otel.GetTextMapPropagator(); len(p.Fields()) > 0 {
		return p, false
	}
	return w3c, true
}

// metadataCarrier lets a propagator read and write message metadata.
type metadataCarrier message.Metadata

func (c metadataCarrier) Get(key string) string { return c[key] }
func (c metadataCarrier) Set(key, value string) { c[key] = value }
func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Span ends a span with the outcome of what it covered. A nil *Span is
// valid and does nothing: no span was started.
type Span struct{ span trace.Span }

// End records err (nil: success) and ends the span.
func (s *Span) End(err error) {
	if s == nil {
		return
	}
	if err != nil {
		s.span.RecordError(err)
		s.span.SetStatus(codes.Error, err.Error())
	}
	s.span.End()
}

// EndWith sets attributes, then ends the span as End does.
func (s *Span) EndWith(err error, attrs ...attribute.KeyValue) {
	if s == nil {
		return
	}
	s.span.SetAttributes(attrs...)
	s.End(err)
}

// StartPublish starts the span of a Publish call of msgs to topic, as a
// child of the first message's context, and injects its context into the
// metadata of every message (traceparent, tracestate), so that the
// consumer's handler continues the trace. Without a trace in that context
// it starts nothing and leaves the metadata alone.
func StartPublish(topic string, msgs []*message.Message) *Span {
	parent := msgs[0].Context()
	if !trace.SpanContextFromContext(parent).IsValid() {
		return nil
	}
	ctx, span := tracer().Start(parent, topic+" publish", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", MessagingSystem),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", topic),
			attribute.Int("messaging.batch.message_count", len(msgs)),
		))
	p, _ := propagator()
	for _, m := range msgs {
		p.Inject(ctx, metadataCarrier(m.Metadata))
	}
	return &Span{span}
}

// ProcessAttributes are the attributes every delivery span of one
// partition worker shares; build them once per worker.
func ProcessAttributes(group, topic string, partition int) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("messaging.system", MessagingSystem),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.destination.name", topic),
		attribute.String("messaging.destination.partition.id", strconv.Itoa(partition)),
		attribute.String("messaging.consumer.group.name", group),
	}
}

// StartProcess continues, in ctx, the trace whose context msg's metadata
// carries, with the span of its delivery (named name, "<topic> process",
// with the worker's shared attributes and the message's own); the returned
// context is the handler's. Without trace context in the metadata it
// starts nothing.
func StartProcess(ctx context.Context, msg *message.Message, name string, shared []attribute.KeyValue, seq int64, id string, attempt int) (context.Context, *Span) {
	p, isW3C := propagator()
	if isW3C && msg.Metadata["traceparent"] == "" {
		return ctx, nil // the common case without tracing, without allocating
	}
	found := false
	for _, f := range p.Fields() {
		if msg.Metadata.Get(f) != "" {
			found = true
			break
		}
	}
	if !found {
		return ctx, nil
	}
	ctx = p.Extract(ctx, metadataCarrier(msg.Metadata))
	ctx, span := tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(shared...))
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.message.id", id),
			attribute.String("messaging.message.conversation_id", msg.UUID),
			attribute.Int64("messaging.outbox.seq", seq),
			attribute.Int("messaging.outbox.attempt", attempt),
		)
	}
	return ctx, &Span{span}
}

// StartInternal starts an internal span (a sequencer pass, a forward
// batch) under ctx.
func StartInternal(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, *Span) {
	ctx, span := tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		append([]attribute.KeyValue{attribute.String("messaging.system", MessagingSystem)}, attrs...)...))
	if !span.IsRecording() {
		return ctx, nil
	}
	return ctx, &Span{span}
}

// RecordInternal records an internal span that started at start and ends
// now, linked to links (none: nil).
func RecordInternal(ctx context.Context, name string, start time.Time, err error, links []trace.Link, attrs ...attribute.KeyValue) {
	_, span := tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithTimestamp(start), trace.WithLinks(links...),
		trace.WithAttributes(append([]attribute.KeyValue{attribute.String("messaging.system", MessagingSystem)}, attrs...)...))
	if !span.IsRecording() {
		return
	}
	(&Span{span}).End(err)
}

// Tracing reports whether a span may be recorded: a tracer provider is set
// (ConfigureTracing, or otel.SetTracerProvider) and it is not a no-op.
// Callers use it to skip gathering what only a span would show.
func Tracing() bool {
	var tp trace.TracerProvider
	if t := tracingConfig.Load(); t != nil && t.provider != nil {
		tp = t.provider
	} else {
		tp = otel.GetTracerProvider()
	}
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return false
	}
	// OpenTelemetry's global provider until one is set: it records nothing
	// (otel.SetTracerProvider replaces it, so a set one is never this).
	typ := reflect.TypeOf(tp)
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	return typ.PkgPath() != "go.opentelemetry.io/otel/internal/global"
}

// MaxPassLinks is the most links of a sequencer pass span (OpenTelemetry's
// default limit of links per span): to the spans of the first messages
// moved that carry trace context, one per distinct span. The span's
// attribute outbox.traced counts them all.
const MaxPassLinks = 128

// PassTrace gathers the trace context of the messages a sequencer pass
// moves, for the links of its span.
type PassTrace struct {
	// Fields are the metadata keys to read (the propagator's), nil when
	// tracing is off; Limit the most trace contexts to read per topic (0:
	// none).
	Fields []string
	Limit  int
	// Traced counts the messages moved that carry trace context; Carriers
	// are distinct trace contexts of the first of them, each a JSON object
	// of Fields.
	Traced   int64
	Carriers []string
}

// StartPassTrace returns what a pass reads for its span's links: nothing
// when tracing is off.
func StartPassTrace() PassTrace {
	if !Tracing() {
		return PassTrace{}
	}
	p, _ := propagator()
	return PassTrace{Fields: p.Fields(), Limit: MaxPassLinks}
}

// Links returns the links to the spans of Carriers: distinct, at most
// MaxPassLinks.
func (p PassTrace) Links() []trace.Link {
	if len(p.Carriers) == 0 {
		return nil
	}
	prop, _ := propagator()
	type spanKey struct {
		trace trace.TraceID
		span  trace.SpanID
	}
	seen := map[spanKey]bool{}
	var links []trace.Link
	for _, c := range p.Carriers {
		var fields map[string]string
		if json.Unmarshal([]byte(c), &fields) != nil {
			continue
		}
		sc := trace.SpanContextFromContext(prop.Extract(context.Background(), propagation.MapCarrier(fields)))
		key := spanKey{sc.TraceID(), sc.SpanID()}
		if !sc.IsValid() || seen[key] {
			continue
		}
		seen[key] = true
		links = append(links, trace.Link{SpanContext: sc})
		if len(links) == MaxPassLinks {
			break
		}
	}
	return links
}

// StartForward starts the span of one forwarder send of msgs (an outbox
// topic's batch) to targetTopic, linked to the messages' own spans (at
// most 128 links).
func StartForward(ctx context.Context, topic, targetTopic string, msgs []*message.Message) *Span {
	var links []trace.Link
	for _, m := range msgs {
		if sc := trace.SpanContextFromContext(m.Context()); sc.IsValid() && len(links) < 128 {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	if len(links) == 0 {
		return nil // nothing traced in this batch
	}
	_, span := tracer().Start(ctx, targetTopic+" send", trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("messaging.system", MessagingSystem),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", targetTopic),
			attribute.String("messaging.outbox.topic", topic),
			attribute.Int("messaging.batch.message_count", len(msgs)),
		))
	return &Span{span}
}
