// Command quickstart is the README's quick start, run: a service whose
// HTTP handler stores an order and publishes OrderPlaced in one
// transaction, and a pipeline that forwards the events to Kafka exactly
// once, with dead letters, retention, Prometheus metrics and a clean
// shutdown on SIGTERM.
//
//	go run ./_examples/quickstart
//
// No setup: PostgreSQL is a throwaway server and Kafka an in-process fake
// (kfake); the example posts a few orders, reads the events back from
// Kafka, scrapes /metrics, stops the service as SIGTERM does (by ending
// its context), and prints OK. With -listen, it is the service itself,
// on the database of DATABASE_URL and the brokers of KAFKA_BROKERS:
//
//	DATABASE_URL=postgres://... KAFKA_BROKERS=localhost:9092 go run ./_examples/quickstart -listen :8080
//
// The part between the quickstart markers is the README's quick start,
// word for word (a test checks it).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/metrics"
	"github.com/millrace/watermill-outbox/pipeline"
)

func main() {
	listen := flag.String("listen", "", "run the service on this address (DATABASE_URL, KAFKA_BROKERS) instead of the demo")
	flag.Parse()
	if *listen == "" {
		exampledb.Main(run)
		return
	}
	if err := service(*listen); err != nil {
		log.Fatal(err)
	}
}

// quickstart:begin

// service is main: it runs serve until SIGTERM or Ctrl-C.
func service(addr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return serve(ctx, pool, strings.Split(os.Getenv("KAFKA_BROKERS"), ","), ln)
}

// serve runs the service until ctx ends (SIGTERM): POST /orders?id=N stores
// an order and publishes OrderPlaced in one transaction, and a pipeline
// forwards the events to Kafka. A message Kafka refuses for good goes to
// the outbox's dead_letters table, forwarded rows are deleted by
// retention, and GET /metrics serves the outbox's metrics.
func serve(ctx context.Context, pool *pgxpool.Pool, kafkaBrokers []string, ln net.Listener) error {
	logger := watermill.NewSlogLogger(nil)
	if err := outbox.Migrate(ctx, pool, outbox.DefaultSchema); err != nil {
		return err
	}
	if err := outbox.RegisterTopic(ctx, pool, outbox.DefaultSchema, "orders", 16); err != nil {
		return err
	}
	target, err := kafka.NewTarget(kafka.Config{Brokers: kafkaBrokers, CreateTopics: true}, logger)
	if err != nil {
		return err
	}
	defer target.Close()
	p, err := pipeline.New(pipeline.Config{Pool: pool, Forward: forwarder.Config{Topics: []string{"orders"}, Target: target}}, logger)
	if err != nil {
		return err
	}
	m, err := metrics.Enable(metrics.Config{Registerer: prometheus.DefaultRegisterer, Pool: pool})
	if err != nil {
		return err
	}
	defer m.Disable()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: pool}, logger)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.Handler())
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.Atoi(r.FormValue("id"))
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error { // commits, or rolls back both
			if _, err := tx.Exec(r.Context(), "INSERT INTO orders (id) VALUES ($1)", id); err != nil {
				return err
			}
			payload, _ := json.Marshal(map[string]int{"order_id": id})
			msg := message.NewMessage(watermill.NewUUID(), payload)
			msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, strconv.Itoa(id)) // in order per key
			msg.SetContext(outbox.WithTx(r.Context(), tx))
			return pub.Publish("orders", msg)
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Shutdown(context.WithoutCancel(ctx)) // lets requests in flight finish
	return p.Run(ctx)                              // until SIGTERM; sends in flight get CloseTimeout
}

// quickstart:end

// run stands up what serve needs (a database with the orders table, a
// Kafka cluster, a local port), runs it, uses it as a client would and
// stops it as SIGTERM would.
func run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	db, err := exampledb.Start(ctx)
	if err != nil {
		return err
	}
	defer db.Stop()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id integer PRIMARY KEY)`); err != nil {
		return err
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return err
	}
	defer cluster.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}

	// The service, stopped by SIGTERM (or SIGINT), as a platform stops it;
	// the example stops it the same way, by ending that context, once it
	// has seen everything.
	sctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	sctx, sigterm := context.WithCancel(sctx)
	defer sigterm()
	served := make(chan error, 1)
	go func() { served <- serve(sctx, db.Pool, cluster.ListenAddrs(), ln) }()

	const orders = 20
	base := "http://" + ln.Addr().String()
	for id := 1; id <= orders; id++ {
		resp, err := http.PostForm(base+"/orders", url.Values{"id": {strconv.Itoa(id)}})
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("POST /orders: %s", resp.Status)
		}
	}
	// A duplicate order fails: neither the row nor the event is stored.
	if resp, err := http.PostForm(base+"/orders", url.Values{"id": {"1"}}); err != nil {
		return err
	} else if resp.Body.Close(); resp.StatusCode == http.StatusOK {
		return errors.New("a duplicate order was accepted")
	}
	fmt.Printf("posted %d orders (and one duplicate, refused)\n", orders)

	if err := readEvents(ctx, cluster.ListenAddrs(), orders); err != nil {
		return err
	}
	if err := scrape(base+"/metrics", "outbox_forwarder_records_total"); err != nil {
		return err
	}
	sigterm()
	select {
	case err := <-served:
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	case <-ctx.Done():
		return errors.New("the service did not stop on SIGTERM")
	}
	fmt.Println("the service stopped cleanly, as on SIGTERM")
	return nil
}

// readEvents reads the orders topic as a read_committed consumer until it
// has n distinct OrderPlaced events.
func readEvents(ctx context.Context, brokers []string, n int) error {
	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer client.Close()
	seen := map[string]bool{}
	for len(seen) < n {
		fetches := client.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%d of %d events at Kafka: %w", len(seen), n, err)
		}
		fetches.EachRecord(func(r *kgo.Record) { seen[string(r.Value)] = true })
	}
	fmt.Printf("Kafka has the %d OrderPlaced events\n", len(seen))
	return nil
}

// scrape fetches url and checks that it serves metric.
func scrape(url, metric string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if !strings.Contains(string(body), metric) {
		return fmt.Errorf("GET /metrics has no %s", metric)
	}
	fmt.Println("GET /metrics serves", metric)
	return nil
}
