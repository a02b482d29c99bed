// Package delivery is the Subscriber's delivery loop: what happens to the
// messages of one partition between reading them and acking them. The
// Subscriber (package outbox) joins a consumer group, the lease manager
// (internal/lease) hands it partitions, and for each leased partition it
// runs one [Worker] until the lease ends.
//
// One turn of a Worker ([Worker.Run], via internal/worker's pacing loop):
//
//  1. Read a batch after the cursor (log.sql: LogReadCounting, or LogRead
//     when the last cursor move already counted the head's delivery). The
//     read counts a delivery of the head message on the cursor row first,
//     so a process that dies mid-delivery is charged an attempt.
//  2. If the head has used up MaxAttempts, reject it to the RejectHandler
//     without delivering it again (rejectExhaustedHead).
//  3. Hand the messages out (handle, or handleBatch for ConsumeBatches),
//     one at a time, each with metadata (MetadataSeq, MetadataAttempt,
//     MetadataID, ...) and a per-message state that Reject marks. Each
//     waits for its Ack or Nack, at most HandlerTimeout. Transactional:
//     all of it inside one transaction, one savepoint per message
//     (transaction.sql), with the handler given a guarded pgx.Tx (txguard.go)
//     that refuses Commit and Rollback.
//  4. Settle: move the cursor past the acked prefix (cursors.sql:
//     CursorsAdvance, fenced by the lease; in the same transaction for
//     Transactional), hand a rejected message to the RejectHandler in the
//     transaction that moves the cursor past it, or record a failed attempt
//     with its backoff (CursorsRetry); let the adaptive policy (package
//     adaptive) shrink or grow the next batch and save its state
//     (CursorsSaveAdaptive).
//
// A Worker sees the rest of the system through three small, explicit
// dependencies: its [Lease] (the cursor row as acquired, and every fenced
// cursor write), its [Policy] (adaptive batching) and the [Store] (reading
// the log, transactions and savepoints, the adaptive state shown by the
// admin status), plus the [Config] its Subscriber shares with all workers.
// It reaches into nobody's private fields.
//
// Every failure ends in a counted attempt and, after MaxAttempts, a
// rejection; see docs/failure-modes.md.
package consumer
