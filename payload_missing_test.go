package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// A message whose payload was kept in bodies, and whose bodies row is gone,
// is never delivered with an empty payload: each delivery of it is a
// counted failed attempt with ErrPayloadMissing, visible on the cursor row,
// and after MaxAttempts it is dead-lettered; the messages around it are
// delivered as usual. In both strategies and through ConsumeBatches.
func TestMissingPayloadIsACountedFailureNeverAnEmptyMessage(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"leased", "transactional", "batches"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			e.Register("orders", 1)
			e.Publish("orders",
				message.NewMessage("before", []byte("small")),
				message.NewMessage("lost", []byte(strings.Repeat("x", 4096))),
				message.NewMessage("after", []byte("small")))
			e.SequenceAll()
			e.Exec("DELETE FROM " + e.Schema + ".bodies")
			rejects, rejected := rejectLog(t, e)
			const maxAttempts = 3
			sub := e.Subscriber("g", func(c *outbox.SubscriberConfig) {
				c.RejectHandler, c.MaxAttempts, c.DisableSequencer = rejects, maxAttempts, true
				if mode == "transactional" {
					c.Strategy = outbox.Transactional
				}
				// Long enough between retries to see a failure recorded.
				c.Tuning.BackoffBase, c.Tuning.BackoffMax = 300*time.Millisecond, 300*time.Millisecond
			})
			ctx, cancel := context.WithCancel(outboxtest.Ctx(t))
			defer cancel()
			got := make(chan *message.Message, 10)
			if mode == "batches" {
				go func() {
					_ = sub.ConsumeBatches(ctx, "orders", func(_ context.Context, batch []*message.Message) (int, error) {
						for _, m := range batch {
							got <- m
						}
						return len(batch), nil
					})
				}()
			} else {
				msgs, err := sub.Subscribe(ctx, "orders")
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					for m := range msgs {
						got <- m
						m.Ack()
					}
				}()
			}
			// The failure is visible while the message is retried.
			outboxtest.WaitFor(t, "a failure recorded", 20*time.Second, func() bool {
				var attempts int
				var lastError string
				_ = e.Pool.QueryRow(ctx, "SELECT attempts, coalesce(last_error, '') FROM "+e.Schema+".cursors WHERE group_name = 'g'").Scan(&attempts, &lastError)
				return attempts >= 1 && strings.Contains(lastError, "payload of seq 2") && strings.Contains(lastError, "missing")
			})
			outboxtest.WaitFor(t, "the dead letter", 20*time.Second, func() bool { return len(rejected()) == 1 })
			r := rejected()[0]
			if r.UUID != "lost" || !errors.Is(r.Reason, outbox.ErrPoison) || !strings.Contains(r.Reason.Error(), "missing") {
				t.Fatalf("dead letter %s: %v", r.UUID, r.Reason)
			}
			var pe *outboxtype.PayloadMissingError
			if !errors.As(r.Reason, &pe) || pe.Seq != 2 || !errors.Is(r.Reason, outbox.ErrPayloadMissing) {
				t.Fatalf("dead letter reason %v: want a *PayloadMissingError for seq 2", r.Reason)
			}
			var delivered []string
			for len(delivered) < 2 {
				select {
				case m := <-got:
					if m.UUID == "lost" {
						t.Fatalf("the message without its payload was delivered (%d bytes)", len(m.Payload))
					}
					delivered = append(delivered, m.UUID)
				case <-time.After(20 * time.Second):
					t.Fatalf("delivered %v, want before and after", delivered)
				}
			}
			if delivered[0] != "before" || delivered[1] != "after" {
				t.Fatalf("delivered %v, want [before after]", delivered)
			}
		})
	}
}
