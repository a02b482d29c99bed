// Package direct forwards a forwarder-only topic (outbox.ForwardOnly) in
// one step (issue 40): its messages are never copied into the log. Per
// round, for every partition the instance holds, one statement reads what
// waits in pending (PendingForwardRead), the target sends all of it in one
// transaction (Target.SendRound: one Kafka transaction), and one statement
// in one transaction records it forwarded (PendingForwarded): the cursors
// move, fenced by the leases, and the rows leave pending. No sequencer
// pass, no log row, no counted read, no goroutine per partition.
//
// # Numbering and the tail
//
// A partition's messages are numbered when they are read, from the
// cursor on, in the order PendingSequence would number them (committed
// rows in id order), so their stable ids (outbox.MetadataID,
// "topic/partition/seq") and their order are those of a sequenced topic.
// The numbers are not stored before the send: a message that commits late
// with a lower id than one already read is numbered after it, which is its
// commit order. So a round's numbers hold only until the round is
// recorded. When it is not (a crash, a lost lease, a commit whose answer
// was lost, a send in doubt), Kafka may hold messages the cursor has not
// moved past, and a new read could number the rest differently. Before a
// partition is read again under a new lease, or after any round of it
// that did not end recorded, the instance reconciles it: the target takes
// it over (fencing its last writer, so nothing more of the old numbering
// can be committed) and reads back the records of the partition Kafka
// holds beyond the cursor; each carries its pending row's id
// (MetadataPendingID), so those rows leave pending and the cursor moves to
// the last of them, in one fenced transaction. Only then is it read.
package direct

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/origin"
)

// MetadataPendingID is the metadata key (a Kafka header) that carries a
// forwarder-only message's pending row id, which the tail read
// recognises it by.
const MetadataPendingID = "outbox_pending_id"

// Held is a record of a partition that Kafka holds: its seq and the id of
// its pending row.
type Held struct {
	Seq       int64
	PendingID int64
}

// Batch is one partition's messages of a round, numbered, and what the
// target made of them.
type Batch struct {
	// From is the partition and the lease it is sent under (not through
	// a context: see origin.Origin).
	From origin.Origin
	// Messages are the partition's messages, in seq order.
	Messages []*message.Message
	// Done is set by SendRound: how many messages from the start Kafka
	// holds committed. Err is why not all (nil when all): one matching
	// outbox.ErrPoison rejects Messages[Done], which can never be sent.
	Done int
	Err  error
}

// Target is what a forwarder-only topic is forwarded through: the Kafka
// target with exactly-once delivery (package forwarder/kafka sets Adapt).
type Target interface {
	// Reconcile takes partition from over under its lease (fencing the
	// partition's last writer) and returns the records of it Kafka holds
	// committed in topic with a seq above after, in seq order.
	Reconcile(ctx context.Context, from origin.Origin, topic string, after int64) ([]Held, error)
	// SendRound sends batches to topic in one transaction when it can
	// (each batch alone when that fails, to find a record to blame), and
	// sets each batch's Done and Err.
	SendRound(ctx context.Context, topic string, batches []*Batch)
}

// Adapt returns the Target of a forwarder.Target, or false when it cannot
// forward a forwarder-only topic. Set by package forwarder/kafka.
var Adapt = func(target any) (Target, bool) { return nil, false }
