// Package origin says where a batch a forwarder sends comes from in the
// outbox: what a target needs to name a Kafka transactional producer per
// outbox partition and to find, in the target topic, what that partition
// already wrote. The Forwarder (package forwarder) passes it to the
// target explicitly (internal/forward's Explicit; no context value), and
// the target completes it from the batch (Of).
package origin

import (
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/consumer"
)

// Origin is where a batch comes from.
type Origin struct {
	// Set by the Forwarder (empty when a target is used on its own).
	// Source is the Forwarder's source (its database), empty unless it
	// has one.
	Source, Schema, Group string
	Partitions            int // of the outbox topic; 0 when unknown

	// From the batch's metadata.
	Topic       string
	Partition   int
	Incarnation string
	// Token is the fencing token of the lease the batch was delivered
	// under (consumer.LeaseToken; 0 when unknown): it changes each time
	// the partition changes hands.
	Token int64
	// Writer is the record of who last wrote the partition into the
	// target, under that lease (consumer.Writer; nil when unknown).
	Writer consumer.WriterRecord
}

// Of returns the origin of batch (not empty): base (the Forwarder's
// source, schema, group and partition count; empty when a target is used
// on its own) completed from the batch, every message of which must come
// from the same outbox partition and carry the outbox metadata the
// Subscriber sets. what names the caller in errors (e.g. "kafka").
func Of(base Origin, batch []*message.Message, what string) (Origin, error) {
	o := base
	first := batch[0]
	o.Topic = first.Metadata.Get(outbox.MetadataTopic)
	o.Incarnation = first.Metadata.Get(outbox.MetadataIncarnation)
	p, err := strconv.Atoi(first.Metadata.Get(outbox.MetadataPartition))
	if err != nil || o.Topic == "" {
		return Origin{}, fmt.Errorf("%w: %s: exactly-once delivery needs the outbox metadata (%s, %s, %s) the outbox Subscriber sets; message %s has none: send outbox deliveries, or set Config.AtLeastOnce",
			outbox.ErrInvalidArgument, what, outbox.MetadataTopic, outbox.MetadataPartition, outbox.MetadataSeq, first.UUID)
	}
	o.Partition = p
	o.Token, _ = consumer.LeaseToken(first)
	o.Writer, _ = consumer.Writer(first)
	for _, m := range batch {
		if m.Metadata.Get(outbox.MetadataTopic) != o.Topic || m.Metadata.Get(outbox.MetadataPartition) != first.Metadata.Get(outbox.MetadataPartition) {
			return Origin{}, fmt.Errorf("%w: %s: a batch mixes outbox partitions (%s and %s/%s): exactly-once delivery sends one outbox partition per batch",
				outbox.ErrInvalidArgument, what, o.Topic+"/"+strconv.Itoa(p), m.Metadata.Get(outbox.MetadataTopic), m.Metadata.Get(outbox.MetadataPartition))
		}
		if _, err := Seq(m, what); err != nil {
			return Origin{}, err
		}
	}
	return o, nil
}

// Seq returns the outbox seq of m (metadata outbox.MetadataSeq, positive).
func Seq(m *message.Message, what string) (int64, error) {
	s, err := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSeq), 10, 64)
	if err != nil || s <= 0 {
		return 0, fmt.Errorf("%w: %s: message %s has no valid %s metadata (%q)", outbox.ErrInvalidArgument, what, m.UUID, outbox.MetadataSeq, m.Metadata.Get(outbox.MetadataSeq))
	}
	return s, nil
}

// Partition returns the outbox partition of m (metadata
// outbox.MetadataPartition), -1 when it has none.
func Partition(m *message.Message) int {
	p, err := strconv.Atoi(m.Metadata.Get(outbox.MetadataPartition))
	if err != nil || p < 0 {
		return -1
	}
	return p
}
