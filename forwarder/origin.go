package forwarder

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
)

// origin says where a batch comes from in the outbox: what a target needs
// to name a Kafka transactional producer per outbox partition and to find,
// in the target topic, what that partition already wrote.
type origin struct {
	// Set by the Forwarder (empty when a target is used on its own).
	schema, group string
	partitions    int // of the outbox topic; 0 when unknown

	// From the batch's metadata.
	topic       string
	partition   int
	incarnation string
}

type originKey struct{}

// withOrigin tells the targets the Forwarder's schema, group and the
// partition count of the outbox topic it is sending.
func withOrigin(ctx context.Context, schema, group string, partitions int) context.Context {
	return context.WithValue(ctx, originKey{}, origin{schema: schema, group: group, partitions: partitions})
}

// originOf returns the origin of batch: every message must come from the
// same outbox partition and carry the outbox metadata the Subscriber sets.
func originOf(ctx context.Context, batch []*message.Message) (origin, error) {
	o, _ := ctx.Value(originKey{}).(origin)
	first := batch[0]
	o.topic = first.Metadata.Get(outbox.MetadataTopic)
	o.incarnation = first.Metadata.Get(outbox.MetadataIncarnation)
	p, err := strconv.Atoi(first.Metadata.Get(outbox.MetadataPartition))
	if err != nil || o.topic == "" {
		return origin{}, fmt.Errorf("%w: forwarder: exactly-once delivery needs the outbox metadata (%s, %s, %s) the outbox Subscriber sets; message %s has none: send outbox deliveries, or set KafkaConfig.AtLeastOnce",
			outbox.ErrInvalidArgument, outbox.MetadataTopic, outbox.MetadataPartition, outbox.MetadataSeq, first.UUID)
	}
	o.partition = p
	for _, m := range batch {
		if m.Metadata.Get(outbox.MetadataTopic) != o.topic || m.Metadata.Get(outbox.MetadataPartition) != first.Metadata.Get(outbox.MetadataPartition) {
			return origin{}, fmt.Errorf("%w: forwarder: a batch mixes outbox partitions (%s and %s/%s): exactly-once delivery sends one outbox partition per batch",
				outbox.ErrInvalidArgument, o.topic+"/"+strconv.Itoa(p), m.Metadata.Get(outbox.MetadataTopic), m.Metadata.Get(outbox.MetadataPartition))
		}
		if _, err := seqOf(m); err != nil {
			return origin{}, err
		}
	}
	return o, nil
}

func seqOf(m *message.Message) (int64, error) {
	s, err := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSeq), 10, 64)
	if err != nil || s <= 0 {
		return 0, fmt.Errorf("%w: forwarder: message %s has no valid %s metadata (%q)", outbox.ErrInvalidArgument, m.UUID, outbox.MetadataSeq, m.Metadata.Get(outbox.MetadataSeq))
	}
	return s, nil
}
