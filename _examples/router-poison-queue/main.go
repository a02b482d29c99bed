// Command router-poison-queue shows the outbox Subscriber under a Watermill
// Router with the Retry and PoisonQueue middleware: a handler that fails now
// and then succeeds on a retry, and messages that can never be handled end
// up in a poison topic — itself an outbox topic, written transactionally —
// while the stream goes on.
//
//	go run ./_examples/router-poison-queue
//
// No setup: PostgreSQL is a throwaway server. The last line printed is OK.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/deadletter"
)

type payment struct {
	ID          int    `json:"id"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
}

const payments = 120

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

	// Publish the payments. Every 25th has a negative amount: poison.
	// Topics are registered once, with their partition count, before use.
	for _, topic := range []string{"payments", "payments.poison"} {
		if err := outbox.RegisterTopic(ctx, db.Pool, outbox.DefaultSchema, topic, 4); err != nil {
			return err
		}
	}
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{DB: db.Pool, OwnTransaction: true}, logger)
	if err != nil {
		return err
	}
	wantPoison := map[int]bool{}
	for id := 1; id <= payments; id++ {
		p := payment{ID: id, Account: "acct-" + strconv.Itoa(id%7), AmountCents: int64(id * 10)}
		if id%25 == 0 {
			p.AmountCents, wantPoison[id] = -1, true
		}
		payload, _ := json.Marshal(p)
		msg := message.NewMessage(watermill.NewUUID(), payload)
		msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, p.Account)
		if err := pub.Publish("payments", msg); err != nil {
			return err
		}
	}
	fmt.Printf("published %d payments, %d of them poison\n", payments, len(wantPoison))

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	if err != nil {
		return err
	}
	// The poison queue is an outbox topic too: the poisoned message is
	// stored durably before the original is acked.
	poisonQueue, err := middleware.PoisonQueue(pub, "payments.poison")
	if err != nil {
		return err
	}
	router.AddMiddleware(
		poisonQueue, // outermost: gets the error once Retry gave up
		middleware.Retry{MaxRetries: 3, InitialInterval: 10 * time.Millisecond, Multiplier: 2}.Middleware, // no Logger: retries are expected here
		middleware.Recoverer,
		// innermost: `return outbox.Reject(msg, err)` dead-letters a message at
		// once (no retries, no poison queue) and is not logged as a failure
		outbox.QuietRejects,
	)

	// The poison queue takes what the handlers give up on; the dead-letter
	// store is the Subscribers' own backstop, for a message that fails
	// past the middleware (a poison queue that cannot publish, say) 5
	// times, which would otherwise stall its partition.
	deadLetters, err := deadletter.NewStore(deadletter.Config{Pool: db.Pool}, logger)
	if err != nil {
		return err
	}
	newSub := func(group string) (*outbox.Subscriber, error) {
		return outbox.NewSubscriber(outbox.SubscriberConfig{Pool: db.Pool, ConsumerGroup: group,
			RejectHandler: deadLetters, MaxAttempts: 5}, logger)
	}
	paymentsSub, err := newSub("charging")
	if err != nil {
		return err
	}
	poisonSub, err := newSub("poison-report")
	if err != nil {
		return err
	}

	var mu sync.Mutex
	charged := map[int]int{}     // payment id -> successful handler runs
	attempts := map[int]int{}    // payment id -> handler runs
	poisoned := map[int]string{} // payment id -> reason
	router.AddConsumerHandler("charge", "payments", paymentsSub, func(msg *message.Message) error {
		var p payment
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return outbox.Reject(msg, err) // unreadable: no retry can help, to the dead letters now
		}
		mu.Lock()
		defer mu.Unlock()
		attempts[p.ID]++
		if p.AmountCents < 0 {
			return errors.New("negative amount")
		}
		if p.ID%10 == 0 && attempts[p.ID] < 3 {
			return errors.New("payment provider busy") // Retry handles it
		}
		charged[p.ID]++
		return nil
	})
	router.AddConsumerHandler("report", "payments.poison", poisonSub, func(msg *message.Message) error {
		var p payment
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		poisoned[p.ID] = msg.Metadata.Get(middleware.ReasonForPoisonedKey)
		return nil
	})

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	defer func() { _ = router.Close(); <-routerDone }()

	for {
		mu.Lock()
		done := len(charged) == payments-len(wantPoison) && len(poisoned) == len(wantPoison)
		mu.Unlock()
		if done {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("charged %d, poisoned %d: %w", len(charged), len(poisoned), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for id := range wantPoison {
		if poisoned[id] == "" || charged[id] != 0 || attempts[id] != 4 {
			return fmt.Errorf("payment %d: poisoned %q, charged %d times, %d attempts", id, poisoned[id], charged[id], attempts[id])
		}
	}
	retried := 0
	for id, n := range charged {
		if id%10 == 0 {
			retried++
		}
		if n != 1 {
			return fmt.Errorf("payment %d charged %d times", id, n)
		}
	}
	fmt.Printf("%d payments charged (%d after retries), %d in payments.poison (reason %q)\n",
		len(charged), retried, len(poisoned), poisoned[25])
	return nil
}
