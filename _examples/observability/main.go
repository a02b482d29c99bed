// Command observability runs the outbox with Prometheus metrics and
// OpenTelemetry tracing on: a handler publishes orders in its transaction
// inside a trace, a Subscriber consumes them (one fails once and is
// retried, one is rejected to the dead-letter store), and the program
// serves /metrics, prints part of a scrape and the spans of one trace, from
// the handler that published to the handler that consumed.
//
//	go run ./_examples/observability
//
// No setup: PostgreSQL is a throwaway server. The last line printed is OK.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/metrics"
)

func main() { exampledb.Main(run) }

func run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	db, err := exampledb.Start(ctx)
	if err != nil {
		return err
	}
	defer db.Stop()
	logger := exampledb.Logger()

	// Metrics: one line. The collector reads lag and the other database
	// figures at most every second here (10 s by default).
	registry := prometheus.NewRegistry()
	m, err := metrics.Enable(metrics.Config{Registerer: registry, Pool: db.Pool, CollectInterval: time.Second})
	if err != nil {
		return err
	}
	defer m.Disable()

	// Tracing: an SDK tracer provider that keeps spans in memory, for
	// printing; a real application exports them (OTLP, ...).
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	outbox.ConfigureTracing(tp, nil)

	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	server := &http.Server{Handler: promhttp.HandlerFor(registry, promhttp.HandlerOpts{})}
	go func() { _ = server.Serve(listener) }()
	defer server.Close()
	fmt.Printf("serving /metrics on http://%s/metrics\n", listener.Addr())

	if err := outbox.RegisterTopic(ctx, db.Pool, outbox.DefaultSchema, "orders", 4); err != nil {
		return err
	}
	store, err := deadletter.NewStore(deadletter.Config{Pool: db.Pool}, logger)
	if err != nil {
		return err
	}

	// The "checkout" handler: publishes ten orders in its transaction, in a
	// trace of its own.
	checkout, span := tp.Tracer("shop").Start(ctx, "checkout")
	tx, err := db.Pool.Begin(checkout)
	if err != nil {
		return err
	}
	pub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{}, logger)
	if err != nil {
		return err
	}
	var msgs []*message.Message
	for i := 1; i <= 10; i++ {
		msg := message.NewMessage(fmt.Sprintf("order-%d", i), []byte(fmt.Sprintf(`{"order": %d}`, i)))
		msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, fmt.Sprintf("customer-%d", i%3))
		msg.SetContext(checkout)
		msgs = append(msgs, msg)
	}
	if err := pub.Publish("orders", msgs...); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	span.End()
	traceID := span.SpanContext().TraceID()

	// The consumer: order-3 fails once, order-7 is poison.
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Pool: db.Pool, ConsumerGroup: "billing", RejectHandler: store, MaxAttempts: 3}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()
	in, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		return err
	}
	var failedOnce atomic.Bool
	var sameTrace atomic.Int32
	finished := map[string]bool{}
	for len(finished) < 10 {
		select {
		case msg := <-in:
			if trace.SpanContextFromContext(msg.Context()).TraceID() == traceID {
				sameTrace.Add(1)
			}
			switch {
			case msg.UUID == "order-3" && failedOnce.CompareAndSwap(false, true):
				msg.Nack()
				continue
			case msg.UUID == "order-7":
				_ = outbox.Reject(msg, errors.New("unknown product"))
			}
			msg.Ack()
			finished[msg.UUID] = true
		case <-ctx.Done():
			return fmt.Errorf("only %d of 10 orders handled", len(finished))
		}
	}
	if sameTrace.Load() == 0 {
		return errors.New("no handler continued the checkout trace")
	}

	// A scrape, once the collector has seen the group catch up.
	var scrape []string
	for {
		if scrape, err = scrapeOutbox(ctx, "http://"+listener.Addr().String()+"/metrics"); err != nil {
			return err
		}
		if contains(scrape, `outbox_lag_messages{group="billing",schema="watermill_outbox",topic="orders"} 0`) &&
			contains(scrape, `outbox_dead_letters{group="billing",schema="watermill_outbox",status="pending",topic="orders"} 1`) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the scrape never showed the group caught up:\n%s", strings.Join(scrape, "\n"))
		case <-time.After(200 * time.Millisecond):
		}
	}
	fmt.Println("\nscrape (outbox_* series, histograms left out):")
	for _, line := range scrape {
		fmt.Println("  " + line)
	}
	for _, want := range []string{
		`outbox_published_messages_total{topic="orders"} 10`,
		`outbox_deliveries_total{group="billing",outcome="reject",topic="orders"} 1`,
	} {
		if !contains(scrape, want) {
			return fmt.Errorf("the scrape lacks %s", want)
		}
	}

	fmt.Printf("\nspans of trace %s:\n", traceID)
	var names []string
	for _, s := range spans.Ended() {
		if s.SpanContext().TraceID() == traceID {
			names = append(names, fmt.Sprintf("  %-16s %-9s parent %s  span %s", s.Name(), s.SpanKind(), s.Parent().SpanID(), s.SpanContext().SpanID()))
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Println(n)
	}
	if len(names) < 3 {
		return fmt.Errorf("the trace has %d spans, want the checkout, the publish and the deliveries", len(names))
	}
	var stored int
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM watermill_outbox.dead_letters`).Scan(&stored)
	}); err != nil || stored != 1 {
		return fmt.Errorf("dead letters: %d, %v", stored, err)
	}
	return nil
}

// scrapeOutbox fetches url and returns its outbox_* samples, without
// histogram buckets.
func scrapeOutbox(ctx context.Context, url string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 1<<20))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "outbox_") && !strings.Contains(line, "_bucket") {
			out = append(out, line)
		}
	}
	return out, sc.Err()
}

func contains(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}
