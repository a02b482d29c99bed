package outbox

import (
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/millrace/watermill-outbox/internal/observe"
)

// ConfigureTracing sets the OpenTelemetry tracer provider and propagator of
// every outbox component of the process. Without a call, or with nil, the
// outbox uses the OpenTelemetry globals (otel.SetTracerProvider,
// otel.SetTextMapPropagator); when the global propagator propagates
// nothing (the default), W3C trace context and baggage.
//
// What is traced, once the application traces at all (a message whose
// context carries a span):
//
//   - Publish: a "<topic> publish" span (producer) in the caller's trace,
//     whose context goes into each message's metadata as traceparent and
//     tracestate, the keys watermill-kafka, watermill-nats and other
//     OpenTelemetry-aware consumers read; the forwarder carries them to
//     Kafka and NATS headers unchanged.
//   - Subscriber: a "<topic> process" span (consumer) per delivery,
//     continuing the publisher's trace; the handler's msg.Context() carries
//     it, and it ends with the delivery's outcome.
//   - Sequencer: an internal span per pass that moved messages, linked to
//     the spans of the messages it moved (one link per distinct span, at
//     most 128; the attribute outbox.traced counts them all).
//   - Forwarder: a "<target> send" span (producer) per send, linked to the
//     spans of its messages.
//
// Attributes follow OpenTelemetry's messaging semantic conventions
// (messaging.system = "watermill_outbox", messaging.destination.name,
// messaging.consumer.group.name, messaging.message.id = MetadataID, ...).
// The core depends on the OpenTelemetry API only.
func ConfigureTracing(tp trace.TracerProvider, p propagation.TextMapPropagator) {
	observe.SetTracing(tp, p)
}
