package chaos

import (
	"fmt"
	"strings"
)

// Status is what became of a message a publisher tried to publish.
type Status int

const (
	// Committed: its transaction committed; it must arrive everywhere (or
	// be dead-lettered).
	Committed Status = iota + 1
	// RolledBack: its transaction rolled back (on purpose or because it
	// failed before COMMIT was sent); it must arrive nowhere.
	RolledBack
	// InDoubt: COMMIT was sent but its answer was lost (the server went
	// away); it may or may not arrive, but when it does it must be in
	// order and under one outbox id.
	InDoubt
)

func (s Status) String() string {
	switch s {
	case Committed:
		return "committed"
	case RolledBack:
		return "rolled back"
	case InDoubt:
		return "in doubt"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Message is one message a publisher tried to publish.
type Message struct {
	// UUID is the Watermill message UUID, unique per published message.
	UUID string
	// Key is its partition key.
	Key string
	// N is its place in its key's order: the committed messages of a key
	// carry increasing N in commit order (the order the outbox must keep).
	N int
	// Payload is what was published; every payload is unique.
	Payload string
	// Poison marks a message that consumers which reject poison must
	// dead-letter instead of handling.
	Poison bool
	// Status is what became of its transaction.
	Status Status
}

// Delivery is one arrival of a message in a stream.
type Delivery struct {
	// OutboxID is the message's outbox.MetadataID as delivered ("" when it
	// had none).
	OutboxID string
	// UUID, Key and Payload are the message as delivered.
	UUID    string
	Key     string
	Payload string
}

// DeadLetter is a message a stream took out as poison.
type DeadLetter struct {
	OutboxID string
	UUID     string
	Reason   string
}

// Stream is everything one consumer of the outbox saw, in the order it saw
// it: a consumer group's handler, the records of a Kafka topic, the outbox
// log itself.
type Stream struct {
	// Name names the stream in faults.
	Name string
	// Reference marks the stream whose outbox ids are the truth (the
	// outbox log): every delivery of the other streams must carry the
	// outbox id of a reference delivery of the same message.
	Reference bool
	// ExactlyOnce forbids every duplicate, even under the same outbox id,
	// and a message both delivered and dead-lettered (the Transactional
	// strategy, whose effects commit with the cursor; the log).
	ExactlyOnce bool
	// RejectsPoison says the stream's handler rejects poison messages:
	// they must end in its dead letters.
	RejectsPoison bool
	// MaxAttempts is the stream's outbox.SubscriberConfig.MaxAttempts:
	// when 0, a message that is not poison (for this stream) can never be
	// dead-lettered legitimately.
	MaxAttempts int
	// Deliveries are the arrivals in the stream's order (per key, the
	// order the consumer handled them in).
	Deliveries []Delivery
	// DeadLetters are the messages the stream took out.
	DeadLetters []DeadLetter
}

// Input is everything a chaos run produced.
type Input struct {
	// Messages are all the messages the publishers tried to publish.
	Messages []Message
	// Streams are what the consumers saw.
	Streams []Stream
}

// Kind is a kind of fault.
type Kind int

// The faults Verify finds.
const (
	// Lost: a committed message neither delivered nor dead-lettered.
	Lost Kind = iota + 1
	// Phantom: a message seen (delivered or dead-lettered) that was rolled
	// back or never published.
	Phantom
	// Reordered: a key's first deliveries out of the key's order.
	Reordered
	// DuplicateNewID: a duplicate without the same outbox id: one message
	// (or one payload) delivered under two outbox ids, or one outbox id
	// carrying two messages.
	DuplicateNewID
	// DuplicateExactlyOnce: a message delivered twice (or delivered and
	// dead-lettered) in an exactly-once stream.
	DuplicateExactlyOnce
	// Corrupt: a delivery whose key or payload differ from what was
	// published, that has no outbox id, or whose outbox id is not that of
	// the message in the reference stream.
	Corrupt
	// UnexpectedDeadLetter: a message dead-lettered where nothing can
	// legitimately reject it (not poison for the stream, no MaxAttempts).
	UnexpectedDeadLetter
	// PoisonDelivered: a poison message delivered in a stream that
	// rejects poison (RejectsPoison): its handler, or its broker, took
	// what it must refuse.
	PoisonDelivered
)

// Kinds lists every Kind.
var Kinds = []Kind{Lost, Phantom, Reordered, DuplicateNewID, DuplicateExactlyOnce, Corrupt, UnexpectedDeadLetter, PoisonDelivered}

func (k Kind) String() string {
	switch k {
	case Lost:
		return "lost"
	case Phantom:
		return "phantom"
	case Reordered:
		return "reordered"
	case DuplicateNewID:
		return "duplicate without the same outbox_id"
	case DuplicateExactlyOnce:
		return "duplicate in an exactly-once stream"
	case Corrupt:
		return "corrupt"
	case UnexpectedDeadLetter:
		return "unexpected dead letter"
	case PoisonDelivered:
		return "poison delivered"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Fault is one violation found by Verify.
type Fault struct {
	Kind     Kind
	Stream   string
	Key      string
	UUID     string
	OutboxID string
	Detail   string
}

func (f Fault) String() string {
	return fmt.Sprintf("%s: %s: key %s, message %s, outbox id %q: %s", f.Stream, f.Kind, f.Key, f.UUID, f.OutboxID, f.Detail)
}

// StreamStats counts what a stream saw.
type StreamStats struct {
	Name string
	// Deliveries counts the arrivals, Distinct the distinct outbox ids
	// among them.
	Deliveries, Distinct int
	// Duplicates counts the arrivals of an outbox id that had arrived
	// before with the same message (allowed at-least-once).
	Duplicates int
	// DeadLetters counts the dead letters; Innocent those of messages that
	// were not poison for the stream (dead-lettered after MaxAttempts).
	DeadLetters, Innocent int
	// InDoubtSeen and InDoubtMissing count the in-doubt messages that
	// arrived and that did not.
	InDoubtSeen, InDoubtMissing int
}

// Report is the outcome of Verify.
type Report struct {
	// Messages counts the published messages by status; Poison the
	// committed poison messages.
	Committed, RolledBack, InDoubt, Poison int
	Streams                                []StreamStats
	Faults                                 []Fault
}

// OK reports whether no fault was found.
func (r Report) OK() bool { return len(r.Faults) == 0 }

// Count returns the number of faults of kind k.
func (r Report) Count(k Kind) int {
	n := 0
	for _, f := range r.Faults {
		if f.Kind == k {
			n++
		}
	}
	return n
}

// String summarizes the report: the counts, then up to 10 faults of each
// kind.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "messages: %d committed (%d poison), %d rolled back, %d in doubt\n", r.Committed, r.Poison, r.RolledBack, r.InDoubt)
	for _, s := range r.Streams {
		fmt.Fprintf(&b, "stream %s: %d deliveries of %d outbox ids, %d duplicates with the same outbox id, %d dead letters (%d not poison), in doubt: %d arrived, %d did not\n",
			s.Name, s.Deliveries, s.Distinct, s.Duplicates, s.DeadLetters, s.Innocent, s.InDoubtSeen, s.InDoubtMissing)
	}
	if r.OK() {
		b.WriteString("no faults\n")
		return b.String()
	}
	for _, k := range Kinds {
		n := r.Count(k)
		if n == 0 {
			continue
		}
		fmt.Fprintf(&b, "%d faults: %s\n", n, k)
		shown := 0
		for _, f := range r.Faults {
			if f.Kind != k {
				continue
			}
			if shown == 10 {
				fmt.Fprintf(&b, "    … and %d more\n", n-shown)
				break
			}
			fmt.Fprintf(&b, "    %s\n", f)
			shown++
		}
	}
	return b.String()
}

// Verify checks what the streams saw against what was published. For
// every stream it reports:
//   - Lost: a committed message neither delivered nor dead-lettered;
//   - Phantom: a delivery or dead letter of a rolled-back message, or of a
//     message never published;
//   - Reordered: per key, a first delivery (the first arrival of an outbox
//     id) whose N is not above the N of the key's first deliveries before
//     it; copies (an outbox id arriving again) are left out, as
//     at-least-once delivery allows them anywhere later;
//   - DuplicateNewID: a message, or a payload, arriving under a second
//     outbox id, or an outbox id arriving with a second message;
//   - DuplicateExactlyOnce: any copy in an exactly-once stream;
//   - Corrupt, UnexpectedDeadLetter and PoisonDelivered (see Kind).
//
// Copies under the same outbox id are allowed in the other streams and
// counted. In-doubt messages may arrive or not. Verify is a pure function:
// the same input gives the same report, faults in stream and arrival
// order.
func Verify(in Input) Report {
	var r Report
	byUUID := make(map[string]*Message, len(in.Messages))
	byPayload := make(map[string]*Message, len(in.Messages))
	for i := range in.Messages {
		m := &in.Messages[i]
		if _, dup := byUUID[m.UUID]; !dup {
			byUUID[m.UUID] = m
		}
		if _, dup := byPayload[m.Payload]; !dup {
			byPayload[m.Payload] = m
		}
		switch m.Status {
		case Committed:
			r.Committed++
			if m.Poison {
				r.Poison++
			}
		case RolledBack:
			r.RolledBack++
		case InDoubt:
			r.InDoubt++
		}
	}
	var ref map[string]string    // outbox id -> uuid
	refID := map[string]string{} // uuid -> its first outbox id, for reports
	for _, s := range in.Streams {
		if s.Reference {
			ref = make(map[string]string, len(s.Deliveries))
			for _, d := range s.Deliveries {
				if _, dup := ref[d.OutboxID]; !dup && d.OutboxID != "" {
					ref[d.OutboxID] = d.UUID
				}
				if _, dup := refID[d.UUID]; !dup {
					refID[d.UUID] = d.OutboxID
				}
			}
		}
	}
	for _, s := range in.Streams {
		st, faults := verifyStream(s, in.Messages, byUUID, byPayload, ref, refID)
		r.Streams = append(r.Streams, st)
		r.Faults = append(r.Faults, faults...)
	}
	return r
}

func verifyStream(s Stream, msgs []Message, byUUID, byPayload map[string]*Message, ref, refID map[string]string) (StreamStats, []Fault) {
	st := StreamStats{Name: s.Name, Deliveries: len(s.Deliveries), DeadLetters: len(s.DeadLetters)}
	var faults []Fault
	fault := func(k Kind, key, uuid, id, format string, args ...any) {
		faults = append(faults, Fault{Kind: k, Stream: s.Name, Key: key, UUID: uuid, OutboxID: id, Detail: fmt.Sprintf(format, args...)})
	}
	// seen checks what is common to deliveries and dead letters: the
	// message exists, committed (or in doubt), and the outbox id is its.
	// It returns the message, nil for a phantom.
	seen := func(what, id, uuid, key string) *Message {
		m := byUUID[uuid]
		switch {
		case m == nil:
			fault(Phantom, key, uuid, id, "%s of a message never published", what)
		case m.Status == RolledBack:
			fault(Phantom, m.Key, uuid, id, "%s of a rolled-back message (n=%d)", what, m.N)
			m = nil // it has no place in its key's order
		}
		if id != "" && ref != nil && !s.Reference {
			if owner, ok := ref[id]; !ok {
				fault(Corrupt, key, uuid, id, "%s under an outbox id that is in no log row", what)
			} else if owner != uuid {
				fault(Corrupt, key, uuid, id, "%s under the outbox id of the log row of message %s", what, owner)
			}
		}
		return m
	}

	uuidOfID := map[string]string{} // outbox id -> uuid of its first arrival
	idOfUUID := map[string]string{} // uuid -> outbox id of its first arrival
	lastN := map[string]int{}
	lastID := map[string]string{}
	delivered := map[string]bool{}
	for _, d := range s.Deliveries {
		if byUUID[d.UUID] == nil {
			if orig := byPayload[d.Payload]; orig != nil {
				fault(DuplicateNewID, orig.Key, d.UUID, d.OutboxID, "the payload of message %s (n=%d) arrived again as message %s", orig.UUID, orig.N, d.UUID)
				continue
			}
		}
		m := seen("delivery", d.OutboxID, d.UUID, d.Key)
		if m == nil {
			continue
		}
		if d.Key != m.Key || d.Payload != m.Payload {
			fault(Corrupt, m.Key, d.UUID, d.OutboxID, "arrived as key %q payload %q, published as key %q payload %q", d.Key, d.Payload, m.Key, m.Payload)
		}
		if d.OutboxID == "" {
			fault(Corrupt, m.Key, d.UUID, "", "delivered without an outbox id")
			continue
		}
		if m.Poison && s.RejectsPoison && !delivered[d.UUID] {
			fault(PoisonDelivered, m.Key, d.UUID, d.OutboxID, "n=%d is poison, which the stream must dead-letter", m.N)
		}
		delivered[d.UUID] = true
		if owner, ok := uuidOfID[d.OutboxID]; ok {
			if owner != d.UUID {
				fault(DuplicateNewID, m.Key, d.UUID, d.OutboxID, "outbox id %s arrived with message %s and again with message %s", d.OutboxID, owner, d.UUID)
				continue
			}
			st.Duplicates++
			if s.ExactlyOnce {
				fault(DuplicateExactlyOnce, m.Key, d.UUID, d.OutboxID, "arrived again (n=%d)", m.N)
			}
			continue
		}
		uuidOfID[d.OutboxID] = d.UUID
		if first, ok := idOfUUID[d.UUID]; ok {
			fault(DuplicateNewID, m.Key, d.UUID, d.OutboxID, "arrived as %s and again as %s", first, d.OutboxID)
			continue
		}
		idOfUUID[d.UUID] = d.OutboxID
		if prev, ok := lastN[m.Key]; ok && m.N <= prev {
			fault(Reordered, m.Key, d.UUID, d.OutboxID, "n=%d arrived after n=%d (%s)", m.N, prev, lastID[m.Key])
			continue
		}
		lastN[m.Key], lastID[m.Key] = m.N, d.OutboxID
	}
	st.Distinct = len(uuidOfID)

	dead := map[string]bool{}
	for _, dl := range s.DeadLetters {
		m := seen("dead letter", dl.OutboxID, dl.UUID, "")
		if m == nil {
			continue
		}
		dead[dl.UUID] = true
		if s.ExactlyOnce && delivered[dl.UUID] {
			fault(DuplicateExactlyOnce, m.Key, dl.UUID, dl.OutboxID, "delivered and dead-lettered (%s)", dl.Reason)
		}
		if !m.Poison || !s.RejectsPoison {
			st.Innocent++
			if s.MaxAttempts == 0 {
				fault(UnexpectedDeadLetter, m.Key, dl.UUID, dl.OutboxID, "dead-lettered though nothing rejects it: %s", dl.Reason)
			}
		}
	}

	for i := range msgs {
		m := &msgs[i]
		if byUUID[m.UUID] != m {
			continue // a second message with a UUID used before
		}
		got := delivered[m.UUID] || dead[m.UUID]
		switch m.Status {
		case Committed:
			if !got {
				what := "never arrived"
				if m.Poison && s.RejectsPoison {
					what = "poison, neither dead-lettered nor delivered"
				}
				fault(Lost, m.Key, m.UUID, refID[m.UUID], "n=%d %s", m.N, what)
			}
		case InDoubt:
			if got {
				st.InDoubtSeen++
			} else {
				st.InDoubtMissing++
			}
		}
	}
	return st, faults
}
