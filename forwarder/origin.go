package forwarder

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	orig "github.com/millrace/watermill-outbox/internal/origin"
)

// origin is internal/origin's Origin for kafka.go and kafka_txn.go while
// they are here (the Kafka target moves to package forwarder/kafka).
type origin struct {
	schema, group string
	partitions    int
	topic         string
	partition     int
	incarnation   string
}

func originOf(ctx context.Context, batch []*message.Message) (origin, error) {
	o, err := orig.Of(ctx, batch, "forwarder")
	if err != nil {
		return origin{}, err
	}
	return origin{schema: o.Schema, group: o.Group, partitions: o.Partitions, topic: o.Topic, partition: o.Partition, incarnation: o.Incarnation}, nil
}

func seqOf(m *message.Message) (int64, error) { return orig.Seq(m, "forwarder") }
