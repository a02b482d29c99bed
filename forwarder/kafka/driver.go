package kafka

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/watermill-outbox/internal/kafkadriver"
)

// The target's logic runs on a driver (internal/kafkadriver): kgo's in
// the product, a model of Kafka in the deterministic simulator, which
// makes its targets through kafkadriver.NewTarget.
func init() {
	kafkadriver.NewTarget = func(cfg any, logger watermill.LoggerAdapter, newDriver kafkadriver.Factory, instance string) (kafkadriver.Target, error) {
		c, ok := cfg.(Config)
		if !ok {
			return nil, fmt.Errorf("kafkadriver.NewTarget: cfg is a %T, not a kafka.Config", cfg)
		}
		if err := c.Validate(); err != nil {
			return nil, err
		}
		if instance == "" {
			instance = newInstanceID()
		}
		return newTarget(c, logger, newDriver, instance), nil
	}
}
