// Package chaos is the outbox's chaos test (TestChaos) and what it is made
// of: a verifier (Verify), child processes that are killed and started
// again (Proc) and the roles they play (RunChild).
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
//     Kafka (kfake in the test process, or a real cluster: see below);
//   - those processes are SIGKILLed at random and started again, or frozen
//     (SIGSTOP) for longer than their leases and woken up as zombies; the
//     PostgreSQL server is restarted in immediate mode (a crash); the
//     brokers go away for a few seconds.
//
// Then it lets the system drain and reads everything back — the outbox
// log, both groups' results and dead letters, the Kafka topic — and Verify
// fails the run on any lost, phantom or per-key reordered message, and on
// any duplicate without the same outbox_id.
//
//	go test ./integration/chaos -run TestChaos -v                             # the CI size, about a minute (-short: 15 s of chaos)
//	go test ./integration/chaos -run TestChaos -v -chaos.duration=10m -timeout=30m
//	go test ./integration/chaos -run TestChaos -v -chaos.seed=42              # the same schedule again
//	go test ./integration/chaos -run TestChaos -v -chaos.selftest             # inject one fault of each kind: must be caught
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
//	go test ./integration/chaos -run TestChaosKafka -v
//
// TestChaosKafkaWAL runs the log-based mode: publishers in outbox.ModeWAL
// (pg_logical_emit_message; 10% of the transactions rolled back, 3% held
// open 0.5-3 s), two relay processes (RoleRelay: a sequencer and the
// relay of the schema's slot, as `outbox pipeline --wal` runs them,
// TakeoverTimeout 3 s) and three exactly-once forwarder processes of one
// consumer group (lease 3 s). The storm: each forwarder SIGKILLed every
// 2-6 s, two forwarders holding leases frozen for 5 s, the relay
// streaming the slot SIGKILLed and frozen past TakeoverTimeout until the
// standby streams it (twice each at least: the storm goes on past the
// run's duration until they happened), a PostgreSQL immediate restart, a
// broker outage, and 1% poison messages of 70 kB (one at least, forced),
// which the Kafka topic's max.message.bytes (64 KiB) refuses. After the
// storm it commits a marker and waits until a relay appended it (so
// every earlier commit was relayed), drains, and verifies: the log holds
// every committed message once in key order and nothing else (the relays
// lost, doubled and invented nothing), the Kafka topic (read_committed)
// the same but the poison, which the forwarders dead-lettered. It fails
// when the storm did less than its schedule guarantees (about 35 s).
//
//	go test ./integration/chaos -run TestChaosKafkaWAL -v
//
// A run of TestChaos, TestChaosKafka or TestChaosKafkaWAL ends its log
// with one line of figures, "CHAOS-RESULT name=value …" (messages, kills,
// freezes, lost, duplicates, dead letters, durations, load average);
// contended.sh runs tests many times in a row with the CPU contended
// (busy loops) and tabulates those lines:
//
//	integration/chaos/contended.sh -n 20 -busy 4   # TestChaosKafka and TestChaosKafkaWAL, 20 times each
//
// TestChaosSources runs one pipeline.Fleet over several databases: three
// PostgreSQL servers whose shards have the same schema, topic, incarnation
// and consumer group (so the same outbox ids), two fleet processes
// (pipeline.Fleet, RoleFleet) SIGKILLed and frozen past their leases, one
// server crashed; the Kafka topic must hold every committed message of
// every source once, in key order, each under the outbox_source of the
// database it was committed in (about 30 s).
//
//	go test ./integration/chaos -run TestChaosSources -v
//
// # Kafka: kfake or a real cluster
//
// The Kafka of a run is franz-go's in-process kfake broker (CI), or, with
// OUTBOX_TEST_KAFKA_BROKERS=host:9092[,host2:9092], that real cluster
// (kafkatest.New); both go through the same code:
//
//   - each run creates its topics (the scenario's partition counts: 8, and
//     5 for the unequal one) under names of its own (a random suffix) and
//     deletes them when it ends; the exactly-once forwarders'
//     transactional ids ("chaos-<run>/…") and the inbox consumers' Kafka
//     consumer groups ("chaos-inbox-<run>", deleted at the end) are the
//     run's own too, so two runs against one cluster, at once or one after
//     the other, never fence or share each other;
//   - the test process runs a breakable TCP proxy per broker address — the
//     seeds and every address the brokers advertise in their metadata
//     (kafkatest.ProxyMap) — and hands the children the map (advertised
//     address → proxy, ChildConfig.BrokerMap); the forwarders dial every
//     connection through it (kgo.Dialer), the inbox consumers too
//     (sarama's Net.Proxy, through watermill-kafka), and an address
//     missing from it is refused, not dialed. A broker outage breaks every
//     proxy: to the children the whole cluster is gone, while it keeps its
//     state. TestChildClientsDialThroughBrokerProxies proves the children's
//     clients reach the advertised addresses only through the map;
//   - the verifier reads the topics back directly, read_committed.
//
// A real cluster must allow transactions (transaction.state.log
// replication and min.insync.replicas its broker count can meet; a single
// broker needs transaction.state.log.replication.factor=1 and
// transaction.state.log.min.isr=1), give the test's principal the right to
// create and delete topics, write transactionally (transactional ids
// "chaos-*"), read, and join, commit and delete consumer groups
// ("chaos-inbox-*"), and advertise listeners the test's machine can reach
// (the proxies dial them; inside Docker, an advertised listener such as
// localhost:9092 published to the host). A broker that joins the cluster
// during a run has no proxy: the children cannot use it. The connections
// are plaintext (as in kafkatest). A run against a remote cluster is
// slower: give it time (-timeout=20m):
//
//	OUTBOX_TEST_KAFKA_BROKERS=localhost:9092 go test ./integration/chaos -run 'TestChaosKafka|TestChildClientsDialThroughBrokerProxies' -v -timeout=20m
//
// The test binary runs itself as the child processes (TestChaosChild, with
// the role in the environment variable EnvChild).
package chaos
