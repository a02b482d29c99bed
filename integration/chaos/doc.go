// Package chaos is the outbox's chaos test (TestChaos) and what it is made
// of: a verifier (Verify), a listener that can go through an outage (Gate,
// for the Kafka broker), child processes that are killed and started again
// (Proc) and the roles they play (RunChild).
//
// TestChaos runs the whole system for a while and breaks it on purpose:
//
//   - publishers in the test process commit, roll back and hold
//     transactions open, each message in the transaction that bumps its
//     key's counter (so a key's committed messages are numbered in commit
//     order); 1% of the messages are poison;
//   - subscriber processes of two consumer groups (Transactional and
//     Leased) record every delivery in a results table and reject poison
//     into the dead-letter store; forwarder processes relay the topic to
//     Kafka (kfake, in the test process, behind a Gate);
//   - those processes are SIGKILLed at random and started again, or frozen
//     (SIGSTOP) for longer than their leases and woken up as zombies; the
//     PostgreSQL server is restarted in immediate mode (a crash); the broker
//     goes away for a few seconds.
//
// Then it lets the system drain and reads everything back — the outbox
// log, both groups' results and dead letters, the Kafka topic — and Verify
// fails the run on any lost, phantom or per-key reordered message, and on
// any duplicate without the same outbox_id.
//
//	go test ./internal/chaos -run TestChaos -v                             # the CI size, about a minute (-short: 15 s of chaos)
//	go test ./internal/chaos -run TestChaos -v -chaos.duration=10m -timeout=30m
//	go test ./internal/chaos -run TestChaos -v -chaos.seed=42              # the same schedule again
//	go test ./internal/chaos -run TestChaos -v -chaos.selftest             # inject one fault of each kind: must be caught
//
// -chaos.rate sets the publishers' pace (messages per second), -chaos.keep
// keeps the logs of a passing run (a failing run always keeps them: the
// children's logs, one file per incarnation, and the server's). The seed
// fixes the schedule (restarts, outages, kills, freezes) and every random
// choice (keys, rollbacks, holds, poison); the timing of the processes is
// not reproducible, so a seed replays the same storm, not the same
// interleaving.
//
// TestChaosKafka runs the same storm with other children and a faster
// schedule (a SIGKILL every 0.4-1.2 s, four freezes of exactly-once
// forwarders): forwarders relaying the topic exactly once to a Kafka topic
// of as many partitions and to one of fewer, two at-least-once forwarder
// groups relaying it into a third topic (every message there at least
// twice), and inbox consumers (a Kafka consumer group, a Router with the
// inbox middleware) applying that third topic. The two exactly-once topics
// and the inbox's effects must hold each message once, in key order; the
// test fails if the storm had fewer than 20 forwarder SIGKILLs or 3
// forwarder freezes.
//
//	go test ./internal/chaos -run TestChaosKafka -v
//
// The test binary runs itself as the child processes (TestChaosChild, with
// the role in the environment variable EnvChild).
package chaos
