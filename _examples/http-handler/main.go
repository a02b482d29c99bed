// Command http-handler shows an HTTP handler that writes an order and
// publishes OrderPlaced in one transaction: a request that fails after
// publishing leaves neither the order nor the event behind.
//
//	go run ./_examples/http-handler
//
// No setup: PostgreSQL is a throwaway server, the HTTP server runs on a
// local port. The last line printed is OK.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/deadletter"
)

type order struct {
	ID         int    `json:"id"`
	Customer   string `json:"customer"`
	TotalCents int64  `json:"total_cents"`
}

// orderHandler serves POST /orders.
type orderHandler struct {
	pool *pgxpool.Pool
	pub  message.Publisher // an outbox.Publisher: it writes into the message's transaction
}

func (h orderHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var o order
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil || o.Customer == "" {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer tx.Rollback(ctx) // undoes the order and the event unless committed

	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, total_cents) VALUES ($1, $2, $3)`, o.ID, o.Customer, o.TotalCents); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			http.Error(w, "order exists", http.StatusConflict)
			return
		}
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	payload, _ := json.Marshal(o)
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, o.Customer)
	msg.Metadata.Set("type", "OrderPlaced")
	msg.SetContext(outbox.WithTx(ctx, tx))
	if err := h.pub.Publish("orders", msg); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	// A check after publishing that fails: the rollback takes the event
	// back together with the order.
	if o.TotalCents <= 0 {
		http.Error(w, "total must be positive", http.StatusUnprocessableEntity)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

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
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id integer PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL)`); err != nil {
		return err
	}
	// Topics are registered once, with their partition count, before use.
	if err := outbox.RegisterTopic(ctx, db.Pool, outbox.DefaultSchema, "orders", 4); err != nil {
		return err
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{}, logger)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", orderHandler{pool: db.Pool, pub: pub})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	fmt.Printf("HTTP server on %s\n", srv.URL)

	requests := []struct {
		o    order
		want int
	}{
		{order{1, "alice", 1200}, http.StatusCreated},
		{order{2, "bob", 500}, http.StatusCreated},
		{order{3, "alice", 0}, http.StatusUnprocessableEntity}, // published, then rolled back
		{order{1, "carol", 700}, http.StatusConflict},          // duplicate id: nothing published
		{order{4, "alice", 300}, http.StatusCreated},
	}
	for _, rq := range requests {
		body, _ := json.Marshal(rq.o)
		resp, err := http.Post(srv.URL+"/orders", "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp.Body.Close()
		fmt.Printf("POST /orders %+v -> %d\n", rq.o, resp.StatusCode)
		if resp.StatusCode != rq.want {
			return fmt.Errorf("order %d: status %d, want %d", rq.o.ID, resp.StatusCode, rq.want)
		}
	}

	// Read the events back: exactly those of the committed orders, and per
	// customer in order.
	// A message that keeps failing goes to the dead-letter store after 5
	// deliveries instead of stalling its partition.
	deadLetters, err := deadletter.NewStore(deadletter.Config{Pool: db.Pool}, logger)
	if err != nil {
		return err
	}
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Pool: db.Pool, ConsumerGroup: "check", RejectHandler: deadLetters, MaxAttempts: 5}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		return err
	}
	var got []int
	for len(got) < 3 {
		select {
		case m := <-msgs:
			var o order
			if err := json.Unmarshal(m.Payload, &o); err != nil {
				return err
			}
			got = append(got, o.ID)
			m.Ack()
		case <-ctx.Done():
			return fmt.Errorf("events %v: %w", got, ctx.Err())
		}
	}
	select {
	case m := <-msgs:
		return fmt.Errorf("unexpected event %s", m.Payload)
	case <-time.After(time.Second):
	}
	if pos(got, 1) > pos(got, 4) {
		return fmt.Errorf("alice's orders arrived as %v", got)
	}
	var n int
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	}); err != nil {
		return err
	}
	if n != 3 {
		return fmt.Errorf("%d orders stored, want 3", n)
	}
	fmt.Printf("3 orders stored, 3 events delivered (orders %v): no event without its order, no order without its event\n", got)
	return nil
}

func pos(ids []int, id int) int {
	for i, v := range ids {
		if v == id {
			return i
		}
	}
	return -1
}
