package consumer

import (
	"context"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Metadata the Subscriber sets on every message it delivers.
const (
	// MetadataTopic is the outbox topic the message was read from.
	MetadataTopic = "outbox_topic"
	// MetadataPartition is its partition.
	MetadataPartition = "outbox_partition"
	// MetadataSeq is its gap-free sequence number within the partition.
	MetadataSeq = "outbox_seq"
	// MetadataAttempt counts deliveries of this message to this consumer
	// group, starting at 1.
	MetadataAttempt = "outbox_attempt"
	// MetadataPartitionKey is the message's partition key, when it has one
	// (the forwarder uses it as the Kafka record key).
	MetadataPartitionKey = "outbox_partition_key"
	// MetadataID is the message's stable id, "topic/partition/seq": the same
	// on every redelivery, so consumers can drop duplicates by it.
	MetadataID = "outbox_id"
	// MetadataIncarnation identifies the incarnation of the topic (its
	// registration time, µs since the Unix epoch): a topic registered
	// again numbers its messages from 1 again, under a new incarnation.
	MetadataIncarnation = "outbox_incarnation"
	// MetadataPublishedAt is when the message was published (the
	// statement that wrote it, or its transaction's commit in the
	// log-based mode), RFC 3339 with nanoseconds, UTC.
	MetadataPublishedAt = "outbox_published_at"
	// MetadataSequencedAt is when it was given its seq, in the same form.
	MetadataSequencedAt = "outbox_sequenced_at"
)

// StableID returns the stable id of the message at seq in partition of topic.
func StableID(topic string, partition int, seq int64) string {
	return topic + "/" + strconv.Itoa(partition) + "/" + strconv.FormatInt(seq, 10)
}

// RejectedMessage, RejectHandler and RejectHandlerFunc are the public
// leaf package's (outboxtype).
type (
	RejectedMessage   = outboxtype.RejectedMessage
	RejectHandler     = outboxtype.RejectHandler
	RejectHandlerFunc = outboxtype.RejectHandlerFunc
)

type deliveryKey struct{}

// delivery is the Subscriber's handle on one delivered message.
type delivery struct {
	span *observe.Span // the delivery's trace span, nil without tracing

	token  int64        // the lease's fencing token
	writer WriterRecord // the lease's record of the partition's writer (nil: none)

	mu       sync.Mutex
	rejected bool
	cause    error
	via      RejectHandler // from RejectTo, nil for the Subscriber's own
}

func (d *delivery) reject(cause error, via RejectHandler) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rejected = true
	if cause == nil {
		cause = sentinel.ErrPoison
	}
	d.cause = cause
	if via != nil {
		d.via = via
	}
}

func (d *delivery) rejection() (bool, RejectHandler, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rejected, d.via, d.cause
}

func deliveryFrom(ctx context.Context) *delivery {
	if ctx == nil {
		return nil
	}
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	return d
}

// LeaseToken returns the fencing token of the lease msg was delivered
// under (ok false: msg was not delivered by a Worker). Each acquisition of
// a partition's lease has a token of its own, larger than the last: a
// target that keeps state per outbox partition (the Kafka target's
// exactly-once producers) tells by it that the partition changed hands
// since, and starts over.
func LeaseToken(msg *message.Message) (token int64, ok bool) {
	if msg == nil {
		return 0, false
	}
	d := deliveryFrom(msg.Context())
	if d == nil || d.token == 0 {
		return 0, false
	}
	return d.token, true
}

// WriterRecord is a partition's record of who last wrote it into a
// forwarder's target, read and set under the partition's lease
// (lease.Lease implements it): an exactly-once target with one
// transactional id per instance reads it at a takeover, fences that
// writer, and records itself (forwarder/kafka, exactly_once.go). Both
// fail with an error matching lease.ErrLeaseLost once the lease is no
// longer the one the message was delivered under.
type WriterRecord interface {
	// Writer returns the last writer ("" nobody yet; known false: the
	// record predates writer records).
	Writer(ctx context.Context) (writer string, known bool, err error)
	// SetWriter records writer.
	SetWriter(ctx context.Context, writer string) error
}

// Writer returns the writer record of the lease msg was delivered under
// (ok false: none: msg was not delivered by a Worker, or its lease keeps
// no record).
func Writer(msg *message.Message) (rec WriterRecord, ok bool) {
	if msg == nil {
		return nil, false
	}
	d := deliveryFrom(msg.Context())
	if d == nil || d.writer == nil {
		return nil, false
	}
	return d.writer, true
}

// Delivered returns ctx marked as the context of a message delivered under
// a lease with token and writer record rec, as a Worker marks the messages
// it delivers: for a target's tests that send messages of their own.
func Delivered(ctx context.Context, token int64, rec WriterRecord) context.Context {
	return context.WithValue(ctx, deliveryKey{}, &delivery{token: token, writer: rec})
}

// IsDelivered reports whether msg was delivered by a Subscriber (so Reject
// on it reaches the Subscriber).
func IsDelivered(msg *message.Message) bool { return msg != nil && deliveryFrom(msg.Context()) != nil }

// IsRejected reports whether msg was delivered by a Worker and marked
// rejected (Reject, RejectTo) since.
func IsRejected(msg *message.Message) bool {
	if msg == nil {
		return false
	}
	d := deliveryFrom(msg.Context())
	if d == nil {
		return false
	}
	rejected, _, _ := d.rejection()
	return rejected
}

// Reject marks msg as poison because of cause (see outbox.Reject), to be
// taken out by via (nil: the Subscriber's RejectHandler), and returns an
// error matching both ErrPoison and cause.
func Reject(msg *message.Message, cause error, via RejectHandler) error {
	if msg == nil {
		return &outboxtype.MessageError{UUID: "<nil>", Reason: "Reject needs the delivered message, got a nil *message.Message"}
	}
	if d := deliveryFrom(msg.Context()); d != nil {
		d.reject(cause, via)
	}
	return &errs.PoisonError{Cause: cause}
}
