package worker_test

import (
	"context"
	"fmt"
	"time"

	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/internal/worker"
)

func ExampleRun() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	backlog := []string{"a", "b", "c"}
	action := worker.ActionFunc(func(ctx context.Context) (worker.Directive, error) {
		if len(backlog) == 0 {
			fmt.Println("nothing to do")
			cancel() // a real worker would stay idle until poked
			return worker.Idle(), nil
		}
		fmt.Println("handled", backlog[0])
		backlog = backlog[1:]
		return worker.Proceed(), nil
	})

	err := worker.Run(ctx, worker.Config{
		Name:   "example",
		Pacing: tune.Pacing{IdleInterval: time.Second}, // no delay between productive polls
	}, action)
	fmt.Println("stopped:", err)
	// Output:
	// handled a
	// handled b
	// handled c
	// nothing to do
	// stopped: <nil>
}

func ExamplePoker() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	poker := worker.NewPoker()

	calls := 0
	action := worker.ActionFunc(func(ctx context.Context) (worker.Directive, error) {
		calls++
		fmt.Println("poll", calls)
		if calls == 1 {
			poker.Poke() // e.g. a NOTIFY arrived: new messages to read
			poker.Poke() // pokes coalesce: this one adds nothing
		} else {
			cancel()
		}
		return worker.Idle(), nil
	})
	// The idle interval is an hour, yet the second poll follows at once.
	_ = worker.Run(ctx, worker.Config{Poker: poker, Pacing: tune.Pacing{IdleInterval: time.Hour}}, action)
	// Output:
	// poll 1
	// poll 2
}

func ExampleBulkhead() {
	bulkhead, err := worker.NewBulkhead(2) // at most two workers query at once
	if err != nil {
		panic(err)
	}
	release, err := bulkhead.Acquire(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println(bulkhead.InUse(), "of", bulkhead.Limit())
	release()
	fmt.Println(bulkhead.InUse(), "of", bulkhead.Limit())
	// Output:
	// 1 of 2
	// 0 of 2
}
