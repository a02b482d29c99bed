// Package observe is how the outbox's components report what they do, for
// metrics (package metrics implements Observer with Prometheus) and
// tracing (the OpenTelemetry helpers of trace.go). Components call the
// process-wide observer, Current(); it is a no-op until metrics.Enable
// adds one, so metrics that are off cost one atomic load per event. Several
// observers may be added at once (metrics.Enable on several registries):
// each gets every event, and each is removed on its own.
package observe

import (
	"sync"
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
	// Forwarding: a forwarder of source (its database; "" unless it has
	// a name) is about to send to topic (the broker's topic or subject),
	// so that its series can exist before the first send.
	Forwarding(source, topic string)
	// Forwarded: the forwarder of source sent a batch of topic to the
	// broker: sent messages and bytes confirmed in took; errKind is "" on
	// success, else the kind of the failure (see forwarder).
	Forwarded(source, topic string, sent, bytes int, took time.Duration, errKind string)
	// KafkaTransaction: an exactly-once Kafka target committed a
	// transaction carrying the batches of batches outbox partitions (a
	// round: forwarder/kafka).
	KafkaTransaction(batches int)
	// SourceUp: a pipeline.Fleet checked the database of source, and
	// reached it (up) or not.
	SourceUp(source string, up bool)
	// SourceRemoved: source left its pipeline.Fleet; its series go.
	SourceRemoved(source string)
}

// Nop is an Observer that does nothing.
type Nop struct{}

func (Nop) Published(string, int, int)                                 {}
func (Nop) SequencerPass(int, time.Duration, map[string]time.Duration) {}
func (Nop) Delivered(string, string, Outcome, int, time.Duration)      {}
func (Nop) Crashed(string, string, int)                                {}
func (Nop) Batch(string, string, int)                                  {}
func (Nop) RetentionDeleted(string, int64)                             {}
func (Nop) Forwarding(string, string)                                  {}
func (Nop) Forwarded(string, string, int, int, time.Duration, string)  {}
func (Nop) KafkaTransaction(int)                                       {}
func (Nop) SourceUp(string, bool)                                      {}
func (Nop) SourceRemoved(string)                                       {}

// fanout reports each event to several observers, in the order they were
// added.
type fanout []Observer

func (f fanout) Published(topic string, messages, bytes int) {
	for _, o := range f {
		o.Published(topic, messages, bytes)
	}
}

func (f fanout) SequencerPass(rows int, took time.Duration, oldest map[string]time.Duration) {
	for _, o := range f {
		o.SequencerPass(rows, took, oldest)
	}
}

func (f fanout) Delivered(group, topic string, outcome Outcome, n int, took time.Duration) {
	for _, o := range f {
		o.Delivered(group, topic, outcome, n, took)
	}
}

func (f fanout) Crashed(group, topic string, n int) {
	for _, o := range f {
		o.Crashed(group, topic, n)
	}
}

func (f fanout) Batch(group, topic string, size int) {
	for _, o := range f {
		o.Batch(group, topic, size)
	}
}

func (f fanout) RetentionDeleted(topic string, rows int64) {
	for _, o := range f {
		o.RetentionDeleted(topic, rows)
	}
}

func (f fanout) Forwarding(source, topic string) {
	for _, o := range f {
		o.Forwarding(source, topic)
	}
}

func (f fanout) Forwarded(source, topic string, sent, bytes int, took time.Duration, errKind string) {
	for _, o := range f {
		o.Forwarded(source, topic, sent, bytes, took, errKind)
	}
}

func (f fanout) KafkaTransaction(batches int) {
	for _, o := range f {
		o.KafkaTransaction(batches)
	}
}

func (f fanout) SourceUp(source string, up bool) {
	for _, o := range f {
		o.SourceUp(source, up)
	}
}

func (f fanout) SourceRemoved(source string) {
	for _, o := range f {
		o.SourceRemoved(source)
	}
}

type holder struct{ o Observer }

var (
	// current is what the components call: nil (none), the one observer
	// added, or a fanout of several. Rebuilt under mu by Add and remove.
	current atomic.Pointer[holder]

	mu        sync.Mutex
	installed []*entry // in the order added
)

// entry is one Add: its own pointer, so that the same observer added twice
// is removed once per remove.
type entry struct{ o Observer }

// Current is the process-wide observer: Nop when none was added, the one
// added, or one that reports to every observer added.
func Current() Observer {
	if h := current.Load(); h != nil {
		return h.o
	}
	return Nop{}
}

// Enabled reports whether an observer is installed, for callers that would
// compute something only to report it.
func Enabled() bool { return current.Load() != nil }

// Add installs o alongside the observers installed already (each gets every
// event) and returns the function that uninstalls o, and o alone; calling
// it again does nothing. A nil o installs nothing.
func Add(o Observer) (remove func()) {
	if o == nil {
		return func() {}
	}
	e := &entry{o}
	mu.Lock()
	installed = append(installed, e)
	publish()
	mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			for i, x := range installed {
				if x == e {
					installed = append(installed[:i:i], installed[i+1:]...)
					break
				}
			}
			publish()
		})
	}
}

// publish makes Current reflect installed; mu is held.
func publish() {
	switch len(installed) {
	case 0:
		current.Store(nil)
	case 1:
		current.Store(&holder{installed[0].o})
	default:
		f := make(fanout, len(installed))
		for i, e := range installed {
			f[i] = e.o
		}
		current.Store(&holder{f})
	}
}
