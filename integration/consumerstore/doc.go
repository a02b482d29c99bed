// Package consumerstore pins the consumer core's in-memory fake
// (internal/consumer/consumerfake), on which internal/consumer's unit
// tests run, to what it stands for: the same scripted scenarios — every
// Store method the core calls and every cursor write of its Lease — run
// through the fake and through PostgreSQL (consumer.PGStore and
// internal/lease's Lease, on a schema of the test's own), and every
// answer, every error's class and the rows left (the cursor row, the held
// rows, the handlers' committed writes) must be equal. The unit tests'
// ground truth cannot drift from the SQL unseen.
package consumerstore
