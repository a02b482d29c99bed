package metrics_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/procstat"
	"github.com/millrace/watermill-outbox/metrics"
)

// BenchmarkObservabilityOverhead measures what metrics and tracing cost:
// 20,000 messages published at 100 per transaction (keyed, 8 partitions),
// sequenced and consumed by a Subscriber that acks each, with metrics and
// tracing off, and on (metrics.Enable with the collector; every message
// in a sampled trace, spans batched to an exporter that drops them), side
// by side. Run with -benchtime 1x -count 5 and compare the medians of
// msgs/s and cpu-us/msg (this process and the PostgreSQL server).
func BenchmarkObservabilityOverhead(b *testing.B) {
	for _, mode := range []struct {
		name             string
		metrics, tracing bool
	}{{"off", false, false}, {"metrics", true, false}, {"tracing", false, true}, {"on", true, true}} {
		b.Run(mode.name, func(b *testing.B) {
			for range b.N {
				rate, cpu := runPipeline(b, mode.metrics, mode.tracing)
				b.ReportMetric(rate, "msgs/s")
				b.ReportMetric(cpu, "cpu-us/msg")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

func runPipeline(b *testing.B, withMetrics, withTracing bool) (rate, cpuPerMsg float64) {
	const total, perTx = 20000, 100
	bundle := outboxtest.Setup(b)
	bundle.Register("orders", 8)
	ctx := context.Background()
	msgCtx := ctx
	if withMetrics {
		m, err := metrics.Enable(metrics.Config{Registerer: prometheus.NewRegistry(), Pool: bundle.Pool, Schema: bundle.Schema})
		if err != nil {
			b.Fatal(err)
		}
		defer m.Disable()
	}
	if withTracing {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		defer tp.Shutdown(ctx)
		outbox.ConfigureTracing(tp, nil)
		defer outbox.ConfigureTracing(nil, nil)
		var end func()
		msgCtx, end = startSpan(tp, ctx)
		defer end()
	}
	var backend int
	if err := bundle.Pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		b.Fatal(err)
	}
	postmaster := procstat.PostmasterOf(backend)
	server0, client0, _ := procstat.CPU(postmaster)
	start := time.Now()

	pub := bundle.Publisher(nil)
	for i := 0; i < total; i += perTx {
		msgs := make([]*message.Message, perTx)
		for j := range msgs {
			msgs[j] = message.NewMessage(watermill.NewUUID(), make([]byte, 200))
			msgs[j].Metadata.Set(outbox.PublishPartitionKeyMetadata, "key-"+strconv.Itoa((i+j)%1000))
			msgs[j].SetContext(msgCtx)
		}
		if err := pub.Publish("orders", msgs...); err != nil {
			b.Fatal(err)
		}
	}
	sub := bundle.Subscriber("bench", func(c *outbox.SubscriberConfig) { c.Tuning = outboxtest.FastTuning() })
	in, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		b.Fatal(err)
	}
	var acked atomic.Int64
	for acked.Load() < total {
		select {
		case msg := <-in:
			msg.Ack()
			acked.Add(1)
		case <-time.After(time.Minute):
			b.Fatalf("%d of %d consumed", acked.Load(), total)
		}
	}
	took := time.Since(start)
	server1, client1, _ := procstat.CPU(postmaster)
	cpu := (server1 - server0) + (client1 - client0)
	return total / took.Seconds(), float64(cpu.Microseconds()) / total
}

func startSpan(tp *sdktrace.TracerProvider, ctx context.Context) (context.Context, func()) {
	ctx, span := tp.Tracer("bench").Start(ctx, "publisher")
	return ctx, func() { span.End() }
}
