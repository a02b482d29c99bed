package adaptive_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/millrace/watermill-outbox/adaptive"
)

func ExampleMode() {
	mode, err := adaptive.NewMode(adaptive.ModeConfig{
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
	mode, _ := adaptive.NewMode(adaptive.Default().ModeConfig())
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
	p := adaptive.Pacing{
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
		fmt.Print(adaptive.ExponentialBackoff(100*time.Millisecond, time.Second, failures), " ")
	}
	fmt.Println()
	// Output: 100ms 100ms 200ms 400ms 800ms 1s
}

func ExampleProfile() {
	tuning, err := adaptive.Profile("low-latency")
	if err != nil {
		panic(err)
	}
	tuning.BatchSize = 20 // profiles are plain values: adjust what you need
	fmt.Println(tuning.Validate(), tuning.BatchSize, tuning.Pacing.IdleInterval)

	_, err = adaptive.Profile("turbo")
	fmt.Println(errors.Is(err, adaptive.ErrUnknownProfile))
	// Output:
	// <nil> 20 10ms
	// true
}

func ExampleTuning_Validate() {
	tuning := adaptive.Default()
	tuning.BackoffMax = 10 * time.Millisecond

	err := tuning.Validate()
	var ce *adaptive.ConfigError
	if errors.As(err, &ce) {
		fmt.Println(ce.Field, "-", ce.Reason)
	}
	fmt.Println(errors.Is(err, adaptive.ErrInvalidConfig))
	// Output:
	// BackoffMax - must be >= BackoffBase (1s), got 10ms
	// true
}
