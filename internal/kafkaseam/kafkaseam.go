// Package kafkaseam holds the test seams of the Kafka target (package
// forwarder/kafka): a send's context can carry a hook that runs before each
// Kafka transaction commits, and a flag that makes the target forget, when
// it (re)gains an outbox partition, what the partition already wrote (no
// tail read: transactions alone). The exactly-once tests use them to play a
// zombie and a takeover by hand; nothing in the library sets them.
package kafkaseam

import "context"

// Seams are the test hooks of one send.
type Seams struct {
	// BeforeCommit, when set, runs before each Kafka transaction commits.
	BeforeCommit func()
	// NoTailRead skips the tail read after fencing.
	NoTailRead bool
}

type key struct{}

// With returns ctx carrying s.
func With(ctx context.Context, s Seams) context.Context {
	return context.WithValue(ctx, key{}, s)
}

// From returns the seams ctx carries (none: the zero Seams).
func From(ctx context.Context) Seams {
	s, _ := ctx.Value(key{}).(Seams)
	return s
}
