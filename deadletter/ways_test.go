package deadletter_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// The three ways a Router's handler dead-letters a message (README,
// "Dead letters: which way"), each under a Transactional Subscriber: the
// writes the handler made in the Subscriber's transaction before it gave
// the message up are undone, whichever way; only the dead letter commits
// with the cursor move, and the next message of the key is handled after
// it. The recommended way, outbox.Reject with the QuietRejects middleware,
// is not logged by the Router as a failed handler.
func TestEveryWayToDeadLetterUndoesATransactionalHandlersWrites(t *testing.T) {
	for _, way := range []string{"Reject with QuietRejects", "PoisonQueue", "MaxAttempts"} {
		t.Run(way, func(t *testing.T) {
			e := newEnv(t)
			ctx := outboxtest.Ctx(t)
			e.Register("orders", 1)
			e.Exec("CREATE TABLE " + e.Schema + ".effects (uuid text PRIMARY KEY)")
			e.Publish("orders", outboxtest.Keyed("good-1", "c-1", 1, "ok"), outboxtest.Keyed("bad", "c-1", 2, "poison"),
				outboxtest.Keyed("good-2", "c-1", 3, "ok"))
			tuning := adaptive.Default()
			tuning.BackoffBase, tuning.BackoffMax = time.Millisecond, 10*time.Millisecond
			sub := e.subscriber(t, "billing", func(c *outbox.SubscriberConfig) {
				c.Strategy, c.MaxAttempts, c.Tuning = outbox.Transactional, 2, tuning
			})
			logs := watermill.NewCaptureLogger()
			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logs)
			if err != nil {
				t.Fatal(err)
			}
			switch way {
			case "PoisonQueue":
				poisonQueue, err := middleware.PoisonQueue(e.store.PoisonPublisher(), "dead_letters")
				if err != nil {
					t.Fatal(err)
				}
				router.AddMiddleware(poisonQueue)
			case "Reject with QuietRejects":
				router.AddMiddleware(outbox.QuietRejects)
			}
			router.AddConsumerHandler("bill", "orders", sub, func(msg *message.Message) error {
				tx, ok := outbox.TxFromContext[pgx.Tx](msg.Context())
				if !ok {
					return errors.New("no transaction in a Transactional delivery")
				}
				if _, err := tx.Exec(msg.Context(), "INSERT INTO "+e.Schema+".effects VALUES ($1) ON CONFLICT DO NOTHING", msg.UUID); err != nil {
					return err
				}
				if string(msg.Payload) != "poison" {
					return nil
				}
				err := errors.New("the card was declined")
				if way == "Reject with QuietRejects" {
					return outbox.Reject(msg, err)
				}
				return err
			})
			runDone := make(chan error, 1)
			go func() { runDone <- router.Run(context.Background()) }()
			outboxtest.WaitFor(t, "the poison message dead-lettered and the next one handled", time.Minute, func() bool {
				return e.count(t, deadletter.Filter{}) == 1 && e.Int("SELECT count(*) FROM "+e.Schema+".effects WHERE uuid = 'good-2'") == 1
			})
			if err := router.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-runDone; err != nil {
				t.Fatal(err)
			}

			var effects []string
			rows, err := e.Pool.Query(ctx, "SELECT uuid FROM "+e.Schema+".effects ORDER BY uuid")
			if err != nil {
				t.Fatal(err)
			}
			if effects, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(effects, []string{"good-1", "good-2"}) {
				t.Fatalf("committed effects %v: want good-1 and good-2 only, the poison message's write undone", effects)
			}
			page, err := e.store.List(ctx, deadletter.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Entries) != 1 || page.Entries[0].UUID != "bad" {
				t.Fatalf("dead letters %+v: want the poison message", page.Entries)
			}
			loggedFailure := slices.ContainsFunc(logs.Captured()[watermill.ErrorLogLevel], func(m watermill.CapturedMessage) bool {
				return m.Msg == "Handler returned error"
			})
			switch way {
			case "Reject with QuietRejects":
				if loggedFailure {
					t.Fatal("the Router logged the deliberate rejection as a failed handler")
				}
			case "MaxAttempts":
				if !loggedFailure { // what QuietRejects spares: the check above can see it
					t.Fatal("the Router did not log the failing handler")
				}
			}
		})
	}
}

// QuietRejects passes on every error but a rejection of a delivered
// message, and a nil handler is an error, not a panic.
func TestQuietRejectsPassesOtherErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	msg := message.NewMessage("not-delivered", nil)
	if _, err := outbox.QuietRejects(func(*message.Message) ([]*message.Message, error) { return nil, boom })(msg); !errors.Is(err, boom) {
		t.Errorf("another error: %v, want it passed on", err)
	}
	// A rejection of a message no Subscriber delivered reaches no
	// Subscriber: the error must reach the Router.
	if _, err := outbox.QuietRejects(func(m *message.Message) ([]*message.Message, error) { return nil, outbox.Reject(m, boom) })(msg); !errors.Is(err, outbox.ErrPoison) {
		t.Errorf("a rejection of a message no Subscriber delivered: %v, want it passed on", err)
	}
	if _, err := outbox.QuietRejects(nil)(msg); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("QuietRejects(nil): %v, want ErrInvalidArgument", err)
	}
}
