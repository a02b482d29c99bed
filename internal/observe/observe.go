// Package observe is how the outbox's components report what they do, for
// metrics (package metrics implements Observer with Prometheus) and
// tracing (the OpenTelemetry helpers of trace.go). Components call the
// process-wide observer, Current(); it is a no-op until metrics.Enable
// installs one, so metrics that are off cost one atomic load per event.
package observe

import (
	"sync/atomic"
	"time"
)

// Outcome is how a delivery ended.
type Outcome string

// The outcomes of a delivery.
const (
	Ack     Outcome = "ack"
	Nack    Outcome = "nack"
	Reject  Outcome = "reject"
	Timeout Outcome = "timeout"
	// Crash: the delivery ended without an outcome (the process died or
	// lost its lease) and was counted as a failed attempt by the next
	// holder of the partition.
	Crash Outcome = "crash"
)

// Observer receives the outbox's events. Every method must be cheap and
// must not block: they run on the delivery and publishing paths.
type Observer interface {
	// Published: a Publish call wrote messages (bytes of payload and
	// metadata) to topic in the caller's transaction.
	Published(topic string, messages, bytes int)
	// SequencerPass: a pass moved rows pending messages into the log in
	// took; oldest is the age of the oldest message moved (its INSERT to
	// its seq), per topic.
	SequencerPass(rows int, took time.Duration, oldest map[string]time.Duration)
	// Delivered: n deliveries to group of messages of topic ended with
	// outcome; the handler call (one message, or a whole batch) took took.
	Delivered(group, topic string, outcome Outcome, n int, took time.Duration)
	// Crashed: n deliveries to group of topic ended without an outcome
	// and were counted as failed attempts when a lease was acquired.
	Crashed(group, topic string, n int)
	// Batch: a partition worker of group read a batch of size messages of
	// topic.
	Batch(group, topic string, size int)
	// RetentionDeleted: the retention vacuum deleted rows messages of
	// topic from the log.
	RetentionDeleted(topic string, rows int64)
	// Forwarded: the forwarder sent a batch of topic to the broker: sent
	// messages and bytes confirmed in took; errKind is "" on success, else
	// the kind of the failure (see forwarder).
	Forwarded(topic string, sent, bytes int, took time.Duration, errKind string)
}

// Nop is an Observer that does nothing.
type Nop struct{}

func (Nop) Published(string, int, int)                                 {}
func (Nop) SequencerPass(int, time.Duration, map[string]time.Duration) {}
func (Nop) Delivered(string, string, Outcome, int, time.Duration)      {}
func (Nop) Crashed(string, string, int)                                {}
func (Nop) Batch(string, string, int)                                  {}
func (Nop) RetentionDeleted(string, int64)                             {}
func (Nop) Forwarded(string, int, int, time.Duration, string)          {}

type holder struct{ o Observer }

var current atomic.Pointer[holder]

// Current is the process-wide observer (Nop until Set).
func Current() Observer {
	if h := current.Load(); h != nil {
		return h.o
	}
	return Nop{}
}

// Enabled reports whether an observer other than Nop is installed, for
// callers that would compute something only to report it.
func Enabled() bool { return current.Load() != nil }

// Set installs o as the process-wide observer (nil: none) and returns the
// previous one.
func Set(o Observer) Observer {
	var h *holder
	if o != nil {
		h = &holder{o}
	}
	prev := current.Swap(h)
	if prev == nil {
		return nil
	}
	return prev.o
}
