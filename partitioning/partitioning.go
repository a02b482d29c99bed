package partitioning

import (
	"fmt"

	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// Bounds on the number of partitions a topic may have.
const (
	// MinPartitions is the smallest valid partition count.
	MinPartitions = 1
	// MaxPartitions is the largest valid partition count.
	MaxPartitions = 1024
)

// PartitionCountError reports a partition count outside
// [MinPartitions, MaxPartitions]. It matches outbox.ErrInvalidPartitionCount
// ([sentinel.ErrInvalidPartitionCount]).
type PartitionCountError struct {
	// Partitions is the rejected partition count.
	Partitions int
}

// Error implements error.
func (e *PartitionCountError) Error() string {
	return fmt.Sprintf("partitioning: invalid partition count %d (must be in %d..%d)",
		e.Partitions, MinPartitions, MaxPartitions)
}

// Is reports whether target is outbox.ErrInvalidPartitionCount.
func (e *PartitionCountError) Is(target error) bool {
	return target == sentinel.ErrInvalidPartitionCount
}

// ValidatePartitions returns nil if partitions lies in
// [MinPartitions, MaxPartitions], and a *PartitionCountError otherwise.
func ValidatePartitions(partitions int) error {
	if partitions < MinPartitions || partitions > MaxPartitions {
		return &PartitionCountError{Partitions: partitions}
	}
	return nil
}

// Partitioner maps a partition key to a partition in [0, partitions).
//
// Implementations must be deterministic and safe for concurrent use, must
// return a valid partition for every key (including the empty key), and must
// reject partition counts outside [MinPartitions, MaxPartitions] with an
// error matching outbox.ErrInvalidPartitionCount.
type Partitioner interface {
	// Partition returns the partition for key among partitions partitions.
	Partition(key string, partitions int) (int, error)
}

// PartitionerFunc adapts an ordinary function to the [Partitioner] interface.
type PartitionerFunc func(key string, partitions int) (int, error)

// Partition calls f(key, partitions).
func (f PartitionerFunc) Partition(key string, partitions int) (int, error) {
	if f == nil {
		return 0, errs.NilArgument("partitioning.PartitionerFunc", "adapt a function that places keys")
	}
	return f(key, partitions)
}

// Default returns the default partitioner, [Murmur2].
func Default() Partitioner {
	return Murmur2{}
}
