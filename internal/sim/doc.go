// Package sim is the deterministic simulator of forwarding (FoundationDB
// and TigerBeetle style): it runs the product's real forwarding code — the
// lease manager (internal/lease), the consumer core's Subscription and
// Workers (internal/consumer), the Forwarder's batch handler
// (internal/forward) and the Kafka target's exactly-once logic (package
// forwarder/kafka: fencing, the tail read, skipping by seq, halving a
// refused batch, rejecting) — with the database, the clock, the network
// and Kafka replaced by deterministic in-memory models, and checks after
// each schedule that nothing committed was lost, duplicated or reordered.
//
// # One seed, one schedule
//
// A run is one seed. Everything random comes from it: the shape of the
// world (instances, partitions, keys, messages, poison), which step of
// which process runs next, and every fault. The processes are the
// forwarder instances (each a lease manager, a Subscription and a Kafka
// target of its own, as a Forwarder process has), the publishers and two
// relays (each the relay package's reader and appender). Each process
// runs its real code on goroutines of its own, and every call they make
// into a model (a statement to the database, a request to Kafka, a read
// of the replication stream) parks the goroutine: the scheduler decides
// which parked call goes on next, and how it ends — answered, failed
// before it took effect, taken effect with its answer lost, or the process
// killed there (all its memory gone, as SIGKILL) — and waits until every
// goroutine is blocked again before it chooses again, so a seed replays
// exactly. Time is testing/synctest's fake clock: it moves
// only when the scheduler lets it (or when every goroutine waits for a
// timer), and every timeout, lease expiry and backoff of the real code
// runs on it.
//
// Faults at any step: kill a process at any call (before or after the
// call took effect), freeze it past its lease (it is simply not scheduled
// while time moves on, then resumes as a zombie with what it held),
// rebalances (instances joining and leaving), relay takeovers (a relay
// silent past wal_sender_timeout loses the slot; a zombie's append is
// fenced by the position), database connection losses and lost commit answers, a
// database crash that loses the commits not yet flushed (the relaxed
// cursor moves), a Kafka outage, lost EndTxn answers, the Kafka client
// ending a commit it was asked for with an abort (what franz-go does when
// it believes no partition was added to the transaction), poison records
// larger than the broker's max message size.
//
// # Checks
//
// After the storm every fault stops, dead processes restart and the world
// drains; then: every message committed to the outbox is in the log once,
// in commit order per partition (the relays), and in Kafka in exactly one committed transaction, in
// per-key (per-partition) order, or dead-lettered — poison only, and only
// poison; no cursor stands past a message that is neither; the world
// drained (nothing stalls). During the run: no partition's lease is held
// by two live instances at once.
//
// # Forwarder-only topics
//
// One seed in three runs a forwarder-only topic (outbox.ForwardOnly): the
// forwarders run internal/direct's loop, which reads pending, numbers the
// rows from each cursor, sends a round and records it. In most of those
// seeds the publishers insert into pending and commit later, out of id
// order, some rolling back; in the others (the log-based mode) they commit
// into the WAL and the relays put the messages into pending in commit
// order. The checks then read the numbering back from Kafka and the dead
// letters: each partition's seqs 1..n taken exactly once, nothing lost or
// sent twice, poison only dead-lettered, order per key, pending empty,
// cursors and last_seq at n. A call a model does not simulate fails the
// run rather than showing as a stall.
//
// # Models, pinned
//
// The models stand for real components, and tests keep them honest: the
// database model implements the statements of internal/dbsql (cursors,
// members, the counted read) as lease.Store and consumer.Store, and
// integration/sim runs the same scenarios through it and through
// PostgreSQL and compares; the Kafka model implements
// internal/kafkadriver.Driver, and integration/sim runs the same scenarios
// through it and through kgo against kfake and compares; the WAL model
// runs the relay package's code on it and on PostgreSQL and compares the
// logs (and, for a forwarder-only topic, what it put into pending).
//
// Run it with go test ./internal/sim (-sim.schedules, -sim.seed to replay
// one, -sim.v to trace it).
package sim
