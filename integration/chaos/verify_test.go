package chaos

import (
	"fmt"
	"strings"
	"testing"
)

// sampleRun is a correct run in miniature: three keys over two partitions,
// committed, rolled-back, in-doubt and poison messages, and four streams
// with what each may legitimately do (the Leased group and Kafka deliver
// copies under the same outbox id, the Leased group dead-letters an
// innocent message after MaxAttempts).
func sampleRun() Input {
	var msgs []Message
	add := func(key string, n int, status Status, poison bool) {
		uuid := fmt.Sprintf("%s-%d-%d", key, n, len(msgs))
		msgs = append(msgs, Message{UUID: uuid, Key: key, N: n, Payload: "payload of " + uuid, Poison: poison, Status: status})
	}
	for _, key := range []string{"a", "b", "c"} {
		for n := 1; n <= 5; n++ {
			add(key, n, Committed, key == "b" && n == 3)
			if n == 2 {
				add(key, n+1, RolledBack, false) // its n is taken again by the next commit
			}
		}
	}
	add("a", 6, InDoubt, false) // committed after all: arrives
	add("c", 6, InDoubt, false) // did not commit: arrives nowhere

	partition := map[string]int{"a": 0, "b": 1, "c": 0}
	var log []Delivery
	ids := map[string]string{}
	seq := map[int]int{}
	for _, m := range msgs {
		if m.Status == Committed || m.UUID == msgs[len(msgs)-2].UUID {
			p := partition[m.Key]
			seq[p]++
			id := fmt.Sprintf("chaos/%d/%d", p, seq[p])
			ids[m.UUID] = id
			log = append(log, Delivery{OutboxID: id, UUID: m.UUID, Key: m.Key, Payload: m.Payload})
		}
	}
	var tx, leased, kafka []Delivery
	var txDead, leasedDead []DeadLetter
	for i, d := range log {
		m := msgs[0]
		for _, x := range msgs {
			if x.UUID == d.UUID {
				m = x
			}
		}
		kafka = append(kafka, d)
		if i == 7 {
			kafka = append(kafka, log[5], log[6], d) // a resent batch: copies
		}
		if m.Poison {
			txDead = append(txDead, DeadLetter{OutboxID: d.OutboxID, UUID: d.UUID, Reason: "poison"})
			leasedDead = append(leasedDead, DeadLetter{OutboxID: d.OutboxID, UUID: d.UUID, Reason: "poison"})
			continue
		}
		tx = append(tx, d)
		if m.Key == "c" && m.N == 4 {
			leasedDead = append(leasedDead, DeadLetter{OutboxID: d.OutboxID, UUID: d.UUID, Reason: "delivered 3 times without success"})
			continue
		}
		leased = append(leased, d)
		if i == 3 {
			leased = append(leased, log[1]) // a redelivery after a crash
		}
	}
	return Input{Messages: msgs, Streams: []Stream{
		{Name: "log", Reference: true, ExactlyOnce: true, Deliveries: log},
		{Name: "transactional", ExactlyOnce: true, RejectsPoison: true, Deliveries: tx, DeadLetters: txDead},
		{Name: "leased", RejectsPoison: true, MaxAttempts: 3, Deliveries: leased, DeadLetters: leasedDead},
		{Name: "kafka", Deliveries: kafka},
	}}
}

func clone(in Input) Input {
	out := Input{Messages: append([]Message(nil), in.Messages...)}
	for _, s := range in.Streams {
		s.Deliveries = append([]Delivery(nil), s.Deliveries...)
		s.DeadLetters = append([]DeadLetter(nil), s.DeadLetters...)
		out.Streams = append(out.Streams, s)
	}
	return out
}

func (in Input) stream(name string) *Stream {
	for i := range in.Streams {
		if in.Streams[i].Name == name {
			return &in.Streams[i]
		}
	}
	panic("no stream " + name)
}

func (in Input) message(key string, n int, status Status) Message {
	for _, m := range in.Messages {
		if m.Key == key && m.N == n && m.Status == status {
			return m
		}
	}
	panic(fmt.Sprintf("no message %s/%d %v", key, n, status))
}

func deliveryOf(s *Stream, uuid string) (int, Delivery) {
	for i, d := range s.Deliveries {
		if d.UUID == uuid {
			return i, d
		}
	}
	panic("not delivered: " + uuid)
}

func without(ds []Delivery, uuid string) []Delivery {
	var out []Delivery
	for _, d := range ds {
		if d.UUID != uuid {
			out = append(out, d)
		}
	}
	return out
}

func TestVerifierPassesACorrectRun(t *testing.T) {
	in := sampleRun()
	r := Verify(in)
	if !r.OK() {
		t.Fatalf("a correct run fails:\n%s", r)
	}
	if r.Committed != 15 || r.RolledBack != 3 || r.InDoubt != 2 || r.Poison != 1 {
		t.Fatalf("counts: %+v", r)
	}
	st := map[string]StreamStats{}
	for _, s := range r.Streams {
		st[s.Name] = s
	}
	if st["kafka"].Duplicates != 3 || st["leased"].Duplicates != 1 || st["leased"].Innocent != 1 || st["transactional"].DeadLetters != 1 {
		t.Fatalf("stream stats: %+v", r.Streams)
	}
	if st["log"].InDoubtSeen != 1 || st["log"].InDoubtMissing != 1 {
		t.Fatalf("in-doubt stats: %+v", st["log"])
	}
	t.Logf("\n%s", r)
}

// TestVerifierCatchesEachFault breaks a correct run in one way at a time,
// in each stream where the fault can happen, and checks that the verifier
// reports that fault, and only that one.
func TestVerifierCatchesEachFault(t *testing.T) {
	base := sampleRun()
	cases := []struct {
		name   string
		stream string
		want   Kind
		inject func(in Input, s *Stream)
		also   Kind // a consequence also reported
	}{
		{"a committed message never arrives", "", Lost, func(in Input, s *Stream) {
			uuid := in.message("a", 4, Committed).UUID
			if s.Reference {
				// Lost before it was sequenced: lost everywhere.
				for i := range in.Streams {
					in.Streams[i].Deliveries = without(in.Streams[i].Deliveries, uuid)
				}
			}
			s.Deliveries = without(s.Deliveries, uuid)
		}, 0},
		{"a committed message arrives but its first delivery is gone (only a late copy is missing too)", "kafka", Lost, func(in Input, s *Stream) {
			s.Deliveries = without(s.Deliveries, in.message("a", 1, Committed).UUID)
		}, 0},
		{"a poison message is neither dead-lettered nor delivered", "transactional", Lost, func(in Input, s *Stream) {
			s.DeadLetters = nil
		}, 0},
		{"a rolled-back message arrives", "", Phantom, func(in Input, s *Stream) {
			m := in.message("b", 3, RolledBack)
			i, _ := deliveryOf(s, in.message("b", 4, Committed).UUID)
			d := Delivery{OutboxID: "chaos/1/99", UUID: m.UUID, Key: m.Key, Payload: m.Payload}
			if !s.Reference {
				// Under the id of a log row: the log, too, holds it.
				in.stream("log").Deliveries = append(in.stream("log").Deliveries, d)
			}
			s.Deliveries = append(s.Deliveries[:i], append([]Delivery{d}, s.Deliveries[i:]...)...)
		}, 0},
		{"a message never published arrives", "leased", Phantom, func(in Input, s *Stream) {
			d := Delivery{OutboxID: "chaos/0/98", UUID: "stranger", Key: "z", Payload: "from nowhere"}
			in.stream("log").Deliveries = append(in.stream("log").Deliveries, d)
			s.Deliveries = append(s.Deliveries, d)
		}, 0},
		{"a rolled-back message is dead-lettered", "leased", Phantom, func(in Input, s *Stream) {
			m := in.message("c", 3, RolledBack)
			s.DeadLetters = append(s.DeadLetters, DeadLetter{UUID: m.UUID, Reason: "poison"})
		}, 0},
		{"two messages of a key arrive swapped", "", Reordered, func(in Input, s *Stream) {
			i, _ := deliveryOf(s, in.message("c", 2, Committed).UUID)
			j, _ := deliveryOf(s, in.message("c", 3, Committed).UUID)
			s.Deliveries[i], s.Deliveries[j] = s.Deliveries[j], s.Deliveries[i]
		}, 0},
		{"a message arrives again under another outbox id", "", DuplicateNewID, func(in Input, s *Stream) {
			_, d := deliveryOf(s, in.message("a", 2, Committed).UUID)
			d.OutboxID = "chaos/0/97"
			if !s.Reference {
				in.stream("log").Deliveries = append(in.stream("log").Deliveries, d)
			}
			s.Deliveries = append(s.Deliveries, d)
		}, 0},
		{"a payload arrives again as another message", "kafka", DuplicateNewID, func(in Input, s *Stream) {
			_, d := deliveryOf(s, in.message("a", 2, Committed).UUID)
			d.UUID, d.OutboxID = "republished", "chaos/0/96"
			in.stream("log").Deliveries = append(in.stream("log").Deliveries, d)
			s.Deliveries = append(s.Deliveries, d)
		}, 0},
		{"an outbox id arrives with another message", "leased", DuplicateNewID, func(in Input, s *Stream) {
			_, first := deliveryOf(s, in.message("a", 1, Committed).UUID)
			_, other := deliveryOf(s, in.message("a", 5, Committed).UUID)
			other.OutboxID = first.OutboxID
			s.Deliveries = append(s.Deliveries, other)
		}, Corrupt},
		{"an exactly-once stream delivers a copy", "transactional", DuplicateExactlyOnce, func(in Input, s *Stream) {
			s.Deliveries = append(s.Deliveries, s.Deliveries[2])
		}, 0},
		{"an exactly-once stream delivers and dead-letters a message", "transactional", DuplicateExactlyOnce, func(in Input, s *Stream) {
			d := s.Deliveries[4]
			s.DeadLetters = append(s.DeadLetters, DeadLetter{OutboxID: d.OutboxID, UUID: d.UUID, Reason: "poison"})
			// Not poison, yet dead-lettered: fine with MaxAttempts.
			s.MaxAttempts = 3
		}, 0},
		{"a payload arrives changed", "kafka", Corrupt, func(in Input, s *Stream) {
			s.Deliveries[3].Payload += "!"
		}, 0},
		{"a message arrives without an outbox id", "leased", Corrupt, func(in Input, s *Stream) {
			// The first arrival has no id, a copy right after has.
			d := s.Deliveries[0]
			s.Deliveries[0].OutboxID = ""
			s.Deliveries = append([]Delivery{s.Deliveries[0], d}, s.Deliveries[1:]...)
		}, 0},
		{"a message arrives under an outbox id no log row has", "kafka", Corrupt, func(in Input, s *Stream) {
			for i := range s.Deliveries {
				if s.Deliveries[i].UUID == in.message("b", 5, Committed).UUID {
					s.Deliveries[i].OutboxID = "chaos/1/95"
				}
			}
		}, 0},
		{"an innocent message is dead-lettered without MaxAttempts", "transactional", UnexpectedDeadLetter, func(in Input, s *Stream) {
			m := in.message("a", 5, Committed)
			s.Deliveries = without(s.Deliveries, m.UUID)
			_, d := deliveryOf(in.stream("log"), m.UUID)
			s.DeadLetters = append(s.DeadLetters, DeadLetter{OutboxID: d.OutboxID, UUID: m.UUID, Reason: "kafka: refused"})
		}, 0},
		{"a poison message is delivered where it must be refused", "leased", PoisonDelivered, func(in Input, s *Stream) {
			m := in.message("b", 3, Committed)
			_, d := deliveryOf(in.stream("log"), m.UUID)
			i, _ := deliveryOf(s, in.message("b", 4, Committed).UUID) // in its key's order
			s.Deliveries = append(s.Deliveries[:i], append([]Delivery{d}, s.Deliveries[i:]...)...)
		}, 0},
	}
	for _, c := range cases {
		streams := []string{c.stream}
		if c.stream == "" {
			streams = []string{"log", "transactional", "leased", "kafka"}
		}
		for _, name := range streams {
			t.Run(c.name+"/"+name, func(t *testing.T) {
				in := clone(base)
				c.inject(in, in.stream(name))
				r := Verify(in)
				if r.Count(c.want) == 0 {
					t.Fatalf("not caught: want a %q fault in %s, got:\n%s", c.want, name, r)
				}
				for _, f := range r.Faults {
					if f.Kind != c.want && f.Kind != c.also {
						t.Fatalf("want only %q faults, got %s", c.want, f)
					}
				}
				if !strings.Contains(r.String(), c.want.String()) {
					t.Fatalf("the summary does not name the fault:\n%s", r)
				}
			})
		}
	}
	// And the base is untouched: clones do not share deliveries.
	if r := Verify(base); !r.OK() {
		t.Fatalf("the base run was changed by the cases:\n%s", r)
	}
}
