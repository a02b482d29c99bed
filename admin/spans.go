package admin

import (
	"context"

	"go.opentelemetry.io/otel/attribute"

	"github.com/millrace/watermill-outbox/internal/observe"
)

// Every operation of Admin that changes what a consumer group does (Pause,
// Resume, ResetCursor, DeleteGroup, RetryHeldNow, DeadLetterHeld) is an
// internal span "outbox admin <operation>" when a tracer provider is set
// (outbox.ConfigureTracing): the group, the topic and what it changed as
// attributes, its error as the span's status. An operator's action then
// shows in the same traces as the deliveries it affected.

// startSpan starts the span of an admin operation on group and topic ("":
// every topic).
func startSpan(ctx context.Context, op, group, topic string) (context.Context, *observe.Span) {
	attrs := []attribute.KeyValue{attribute.String("messaging.consumer.group.name", group)}
	if topic != "" {
		attrs = append(attrs, attribute.String("messaging.destination.name", topic))
	}
	return observe.StartInternal(ctx, "outbox admin "+op, attrs...)
}

// changed is the attribute of how many partitions, messages or rows an
// operation changed.
func changed(n int) attribute.KeyValue { return attribute.Int("messaging.outbox.admin.changed", n) }
