package tune_test

import (
	"fmt"
	"time"

	"github.com/millrace/watermill-outbox/internal/tune"
)

func ExampleMode() {
	mode, err := tune.NewMode(tune.ModeConfig{
		BatchSize:    8,
		DegradeAfter: 1,
		BackoffBase:  time.Second,
		BackoffMax:   time.Minute,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(mode.State(), mode.BatchSize())

	// The handler failed on the fourth message of a batch: three succeeded.
	mode.Failed(3)
	fmt.Println(mode.State(), mode.BatchSize(), "retry in", mode.Backoff())

	// Each successful batch doubles the size again, up to the configured 8.
	for range 2 {
		mode.Succeeded()
		fmt.Println(mode.State(), mode.BatchSize())
	}
	// Output:
	// normal 8
	// degraded 3 retry in 1s
	// degraded 6
	// normal 8
}

func ExampleMode_Rejected() {
	mode, _ := tune.NewMode(tune.Default.Settings(50, time.Second, time.Minute, time.Second).ModeConfig())
	mode.Failed(0)
	// A poison message was dead-lettered after 5 good ones: shrink the batch,
	// but there is nothing to back off from.
	mode.Rejected(5)
	fmt.Printf("%+v\n", mode.Status())
	fmt.Println("retry in", mode.Backoff())
	// Output:
	// {State:degraded BatchSize:5 ConfiguredBatchSize:50 ConsecutiveFailures:0 ConsecutiveSuccesses:0}
	// retry in 1s
}

func ExamplePacing_ProceedDelay() {
	p := tune.Pacing{
		MinInterval:    10 * time.Millisecond,
		ActiveInterval: 40 * time.Millisecond,
		RampStep:       10 * time.Millisecond,
		IdleInterval:   time.Second,
	}
	for streak := 1; streak <= 5; streak++ {
		fmt.Print(p.ProceedDelay(streak), " ")
	}
	fmt.Println()
	// Output: 40ms 30ms 20ms 10ms 10ms
}

func ExampleExponentialBackoff() {
	for failures := 0; failures <= 5; failures++ {
		fmt.Print(tune.ExponentialBackoff(100*time.Millisecond, time.Second, failures), " ")
	}
	fmt.Println()
	// Output: 100ms 100ms 200ms 400ms 800ms 1s
}
