package observe

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing is off, and a sequencer pass reads no trace context for links,
// until a provider that records is configured.
func TestTracingIsOnOnlyWithAProviderThatRecords(t *testing.T) {
	t.Cleanup(func() { SetTracing(nil, nil) })
	if Tracing() {
		t.Error("Tracing() with OpenTelemetry's default global provider")
	}
	if p := StartPassTrace(); p.Limit != 0 || p.Fields != nil {
		t.Errorf("StartPassTrace() without tracing = %+v, want nothing to read", p)
	}
	SetTracing(noop.NewTracerProvider(), nil)
	if Tracing() {
		t.Error("Tracing() with a no-op provider")
	}
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	SetTracing(tp, nil)
	if !Tracing() {
		t.Error("Tracing() = false with an SDK provider")
	}
	p := StartPassTrace()
	if p.Limit != MaxPassLinks || len(p.Fields) == 0 {
		t.Errorf("StartPassTrace() with tracing = %+v", p)
	}
	// Carriers: two of the same span, one broken, one without a valid
	// context: one link.
	p.Carriers = []string{
		`{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`,
		`{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "baggage": "k=v"}`,
		`not json`,
		`{"baggage": "k=v"}`,
	}
	if links := p.Links(); len(links) != 1 || links[0].SpanContext.SpanID().String() != "b7ad6b7169203331" {
		t.Errorf("Links() = %v, want the one span", links)
	}
}
