package outbox

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/errs"
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
)

// StableID returns the stable id of the message at seq in partition of topic.
func StableID(topic string, partition int, seq int64) string {
	return topic + "/" + strconv.Itoa(partition) + "/" + strconv.FormatInt(seq, 10)
}

// ErrPoison marks a message that can never be processed (a permanent error):
// the Subscriber takes it out of the stream instead of retrying it.
var ErrPoison = errors.New("outbox: poison message")

// poisonError carries the cause of a rejection.
type poisonError struct{ cause error }

func (e *poisonError) Error() string {
	if e.cause == nil {
		return ErrPoison.Error()
	}
	return ErrPoison.Error() + ": " + e.cause.Error()
}
func (e *poisonError) Unwrap() []error { return []error{ErrPoison, e.cause} }

// Reject marks msg, a message delivered by a Subscriber, as poison because of
// cause, and returns an error matching both ErrPoison and cause, so that a
// handler can end with `return outbox.Reject(msg, err)`. Whether the handler
// then acks or nacks, the Subscriber hands the message to its RejectHandler
// (e.g. the dead-letter store) in the same transaction that moves the cursor
// past the message, shrinks the batch at once and goes on without backoff.
// A Subscriber without a RejectHandler retries the message instead (and
// logs a warning); use RejectTo to name the handler at the call site.
//
// A nil msg is a programming error reported as ErrInvalidMessage.
func Reject(msg *message.Message, cause error) error {
	return RejectTo(msg, cause, nil)
}

// RejectTo is Reject with the RejectHandler that takes the message out
// (e.g. a deadletter.Store), for a Subscriber configured without one:
// wiring the store once, where the message is rejected, is enough. With
// h nil it is Reject. The handler runs as a RejectHandler does, in the
// transaction that moves the cursor past the message.
func RejectTo(msg *message.Message, cause error, h RejectHandler) error {
	if msg == nil {
		return &errs.MessageError{UUID: "<nil>", Reason: "Reject needs the delivered message, got a nil *message.Message"}
	}
	if d := deliveryFrom(msg.Context()); d != nil {
		d.reject(cause, h)
	}
	return &poisonError{cause: cause}
}

// RejectedMessage is a message taken out of its stream as poison.
type RejectedMessage struct {
	Group        string
	Topic        string
	Partition    int
	Seq          int64
	UUID         string
	PartitionKey string
	Metadata     map[string]string
	Payload      []byte
	// Reason is the cause given to Reject (or the last handler failure when
	// the message ran out of attempts).
	Reason error
	// Attempts is how many times the message was delivered.
	Attempts int
	// FirstFailure and LastFailure bound the failures seen for it.
	FirstFailure, LastFailure time.Time
}

// RejectHandler takes rejected messages out of the stream, typically into a
// dead-letter store. HandleReject runs in tx, the transaction that also
// moves the group's cursor past the message, so the message is stored as
// rejected if and only if the cursor moves. An error keeps the message in
// the stream (it is retried like a Nack).
type RejectHandler interface {
	HandleReject(ctx context.Context, tx pgx.Tx, m RejectedMessage) error
}

// RejectHandlerFunc adapts a function to RejectHandler.
type RejectHandlerFunc func(ctx context.Context, tx pgx.Tx, m RejectedMessage) error

// HandleReject calls f.
func (f RejectHandlerFunc) HandleReject(ctx context.Context, tx pgx.Tx, m RejectedMessage) error {
	return f(ctx, tx, m)
}

type deliveryKey struct{}

// delivery is the Subscriber's handle on one delivered message.
type delivery struct {
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
		cause = ErrPoison
	}
	d.cause = cause
	if via != nil {
		d.via = via
	}
}

func (d *delivery) rejection() (bool, error, RejectHandler) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rejected, d.cause, d.via
}

func deliveryFrom(ctx context.Context) *delivery {
	if ctx == nil {
		return nil
	}
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	return d
}

// IsDelivered reports whether msg was delivered by a Subscriber (so Reject
// on it reaches the Subscriber).
func IsDelivered(msg *message.Message) bool { return deliveryFrom(msg.Context()) != nil }
