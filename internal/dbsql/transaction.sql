-- Transaction control of the Subscriber's delivery loop: no table. Each
-- message of a transactional batch runs under a savepoint, so that a Nack
-- undoes only its own writes; the batch has one too, for the adaptive
-- policy's isolation of a poison message.

-- name: TxSavepointDelivery
SAVEPOINT outbox_delivery;

-- name: TxNextDelivery
-- Releases the previous message's savepoint (which fails if its handler
-- aborted the transaction) and sets this one's, in one round trip (run with
-- the simple protocol: two statements).
RELEASE SAVEPOINT outbox_delivery; SAVEPOINT outbox_delivery;

-- name: TxReleaseDelivery
RELEASE SAVEPOINT outbox_delivery;

-- name: TxRollbackDelivery
ROLLBACK TO SAVEPOINT outbox_delivery;

-- name: TxSavepointBatch
SAVEPOINT outbox_batch;

-- name: TxReleaseBatch
RELEASE SAVEPOINT outbox_batch;

-- name: TxRollbackBatch
ROLLBACK TO SAVEPOINT outbox_batch;

-- name: TxRelaxedCommit
-- The transaction commits without waiting for its WAL flush (a Leased
-- scan move that also holds messages back, like CursorsAdvanceRelaxed).
SET LOCAL synchronous_commit TO off;
