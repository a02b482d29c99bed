// Package deadletter is a dead-letter store for the outbox, in PostgreSQL
// (table dead_letters, created by outbox.Migrate).
//
// A Store is an outboxtype.RejectHandler: configured as a Subscriber's
// RejectHandler, it stores every message the Subscriber takes out of its
// stream (outbox.Reject, ErrPoison, MaxAttempts) in the same transaction
// that moves the group's cursor past it, so a message is dead-lettered if
// and only if the cursor moves, and a retried write never duplicates an
// entry (one entry per group, topic, partition and seq).
//
// Store.PoisonPublisher adapts Watermill's PoisonQueue middleware to the
// store: a message delivered by an outbox Subscriber is rejected (and stored
// by the Subscriber as above); any other message is written directly.
//
// Entries are listed with stable keyset paging (List, Count, Get), published
// again (Replay, in one transaction with the status change), set aside
// (Discard) and deleted when old (Purge).
package deadletter
