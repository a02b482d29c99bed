package outbox

import (
	"fmt"

	"github.com/millrace/watermill-outbox/outboxtype"
)

// The pool a Transactional Subscriber needs. Each partition worker holds a
// connection for its whole batch, handler time included, and the lease
// renewals and the sequencer's passes take theirs from the same pool: a
// pool smaller than the partitions working at once plus those starves the
// renewals, and a lease not renewed within LeaseTTL is lost — the
// partitions then change hands over and over while nothing is delivered
// (docs/postgresql.md, "Pool size"). A Leased worker holds a connection
// only for a read or a cursor move, so a small pool makes it slower, not
// stuck: it is not checked.

// poolReserve is what a Subscriber takes from its pool besides its
// workers: the lease renewals, and its sequencer's passes (none with
// DisableSequencer).
func (s *Subscriber) poolReserve() int {
	if s.cfg.DisableSequencer {
		return 1
	}
	return 2
}

// checkPool refuses to join topic (partitions) when the Subscriber is
// Transactional and its pool cannot give every partition it may work on
// at once (the topics it joined, at most Advanced.MaxConcurrentPartitions)
// a connection and keep poolReserve for the rest: a *ConfigError on Pool
// that says the number. On success the topic counts from then on.
func (s *Subscriber) checkPool(topic string, partitions int) error {
	s.topicsMu.Lock()
	defer s.topicsMu.Unlock()
	if s.cfg.Strategy != Transactional || s.cfg.Pool == nil {
		return nil
	}
	total := partitions
	for t, n := range s.joined {
		if t != topic {
			total += n
		}
	}
	working := min(total, s.cfg.Advanced.MaxConcurrentPartitions)
	need := working + s.poolReserve()
	if have := int(s.cfg.Pool.Config().MaxConns); have < need {
		return &outboxtype.ConfigError{Field: "Pool", Reason: fmt.Sprintf(
			"MaxConns is %d, and a Transactional Subscriber on %q needs at least %d: a connection for each of the %d partitions it may work on at once (min(partitions of its topics %d, Advanced.MaxConcurrentPartitions %d)), which hold theirs for a whole batch, and %d for its lease renewals and sequencer; with fewer, renewals wait for a connection and leases are lost. Set pool_max_conns=%d or more in the connection string (pgxpool.Config.MaxConns), or lower Tuning.Advanced.MaxConcurrentPartitions",
			have, topic, need, working, total, s.cfg.Advanced.MaxConcurrentPartitions, s.poolReserve(), need)}
	}
	if s.joined == nil {
		s.joined = map[string]int{}
	}
	s.joined[topic] = partitions
	return nil
}
