package adaptive_test

import (
	"errors"
	"fmt"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func ExampleProfile() {
	tuning, err := adaptive.Profile("low-latency")
	if err != nil {
		panic(err)
	}
	tuning.BatchSize = 20 // profiles are plain values: adjust what you need
	fmt.Println(tuning.Validate(), tuning.BatchSize, tuning.ProfileName())

	_, err = adaptive.Profile("turbo")
	fmt.Println(errors.Is(err, adaptive.ErrUnknownProfile))
	// Output:
	// <nil> 20 low-latency
	// true
}

func ExampleTuning_WithDefaults() {
	// Set only what you need: the other fields take the profile's values
	// (Default()'s here).
	tuning := adaptive.Tuning{BatchSize: 200}.WithDefaults()
	fmt.Println(tuning.BatchSize, tuning.BackoffBase, tuning.BackoffMax, tuning.LeaseTTL)

	// BackoffMax follows a BackoffBase set above its profile's value.
	fmt.Println(adaptive.Tuning{BackoffBase: 5 * time.Minute}.WithDefaults().BackoffMax)
	// Output:
	// 200 1s 1m0s 30s
	// 5m0s
}

func ExampleTuning_Validate() {
	tuning := adaptive.Default()
	tuning.BackoffMax = 10 * time.Millisecond

	err := tuning.Validate()
	var ce *outboxtype.ConfigError
	if errors.As(err, &ce) {
		fmt.Println(ce.Field, "-", ce.Reason)
	}
	fmt.Println(errors.Is(err, outbox.ErrInvalidConfig))
	// Output:
	// BackoffMax - must be >= BackoffBase (1s), got 10ms
	// true
}
