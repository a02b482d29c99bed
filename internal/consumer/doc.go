// Package consumer is the delivery core the Subscriber (and so the
// Forwarder and package outboxtest) runs: what happens to the messages of
// one leased partition between reading them and acking them. The
// Subscriber joins a consumer group, the lease manager (internal/lease)
// hands it partitions, and for each leased partition it runs one [Worker]
// until the lease ends.
//
// One turn of a Worker ([Worker.Step], repeated by [Worker.Run] through
// internal/worker's pacing loop) reads top to bottom in partition.go's
// scan:
//
//  1. read: a batch after the cursor, in the statement that counts a
//     delivery of its head and records what is in flight (crash evidence,
//     below) on the cursor row;
//  2. triage: key isolation parks the messages of held keys; a head that
//     used up MaxAttempts is taken out without another delivery;
//  3. handle (handle.go, batch.go): hand the messages out — one at a time
//     over the subscription's channel, each waiting for its Ack or Nack at
//     most HandlerTimeout, or all at once to a BatchHandler — and return
//     what came of it as a value (handled);
//  4. settle (settle.go): move the cursor past the done prefix, hand a
//     rejected message to its RejectHandler in the transaction that moves
//     the cursor past it, or record a failed attempt with its backoff; the
//     Transactional strategy does it in the batch's transaction (its scope,
//     where the handlers' writes are), which commits, the Leased one in
//     statements of its own. The adaptive policy learns from the outcome
//     and picks the next step (proceed, idle, sleep).
//
// The files, each with one concept:
//
//   - partition.go: the Worker, its lifecycle (Run, Step, Stop) and scan;
//   - progress.go, ledger.go: where the Worker stands — its cursor, the
//     attempt ledger of the message it follows (deliveries, failures
//     recorded, MaxAttempts), the suspects — and the only code that
//     changes it, one method per event (a test reads the package's source
//     and fails on a write anywhere else);
//   - handle.go, batch.go: handing out and waiting for answers;
//   - settle.go: the transaction scope and recording the outcome, every
//     cursor move in the database included (moveScan);
//   - isolation.go, held.go: key isolation — sorting a read batch into
//     what is delivered and what waits behind a held key, holding a
//     failure, and retrying the held keys before each scan;
//   - gate.go, marker.go: crash evidence — the process's delivery gate and
//     careful mode's per-message records (docs/failure-modes.md §3);
//   - message.go, txguard.go: the delivered message's handle (Reject) and
//     the guarded transaction a Transactional handler gets;
//   - deadletter.go: the dead letter row a RejectHandler writes
//     (InsertDeadLetter, shared with package deadletter);
//   - subscription.go: a topic's delivery in this process — the lease
//     manager's partitions, a Worker each; tasks.go: the goroutines a
//     worker leaves behind (an abandoned handler's rollback);
//   - config.go: what the workers of a subscription share (Config);
//     deps.go, store_pg.go: the Lease, Policy and Store it depends on
//     (Lease and Store defined in internal/consumer/seam), and their
//     PostgreSQL implementations; internal/consumer/consumerfake has
//     in-memory ones, on which the unit tests run in milliseconds under
//     testing/synctest, pinned to the SQL by integration/consumerstore.
//
// Every failure ends in a counted attempt and, after MaxAttempts, a
// rejection; see docs/failure-modes.md.
package consumer
