package kafka

import (
	"context"
	"strconv"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/partitioning"
)

// Partitioner returns the partitioner of the target's clients. A keyed
// record goes where Kafka's Java client (and kgo's
// StickyKeyPartitioner(nil), and the outbox) puts its key:
// toPositive(murmur2(key)) % partitions; with equal partition counts a key
// lands on the same partition number in Kafka as in the outbox. A keyless
// record goes to the partition number its message had in the outbox,
// modulo the partition count (so keyless messages keep the order they had
// there): the target tells it through the record's context, or else the
// record's outbox_partition header (outbox.MetadataPartition) does; without
// either, round-robin.
func Partitioner() kgo.Partitioner {
	hash := kgo.KafkaHasher(func(key []byte) uint32 { return uint32(partitioning.Murmur2Hash(key)) })
	return kgo.BasicConsistentPartitioner(func(string) func(*kgo.Record, int) int {
		var next atomic.Uint32
		return func(r *kgo.Record, n int) int {
			if r.Key != nil {
				return hash(r.Key, n)
			}
			if p := recordOutboxPartition(r); p >= 0 {
				return p % n
			}
			return int(next.Add(1) % uint32(n))
		}
	})
}

type partitionKey struct{}

// withOutboxPartition returns ctx telling the partitioner the outbox
// partition of a record.
func withOutboxPartition(ctx context.Context, p int) context.Context {
	return context.WithValue(ctx, partitionKey{}, p)
}

func recordOutboxPartition(r *kgo.Record) int {
	if r.Context != nil {
		if p, ok := r.Context.Value(partitionKey{}).(int); ok && p >= 0 {
			return p
		}
	}
	for _, h := range r.Headers {
		if h.Key == outbox.MetadataPartition {
			if p, err := strconv.Atoi(string(h.Value)); err == nil && p >= 0 {
				return p
			}
		}
	}
	return -1
}
