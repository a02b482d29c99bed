-- A partition's writer into a forwarder's target (issue 40): the Kafka
-- target's exactly-once producer is one per forwarder instance, no longer
-- one per outbox partition, so a partition's next owner must know whom to
-- fence. cursors.writer is the transactional id that last wrote the
-- partition, recorded by its owner only after it fenced the one before
-- (CursorsSetWriter). Rows from before this migration keep NULL: an older
-- forwarder may have written them under its per-partition transactional
-- id, which a takeover of such a row fences; rows created from now on
-- start at '' (nobody wrote yet).
ALTER TABLE {{schema}}.cursors ADD COLUMN writer text;
ALTER TABLE {{schema}}.cursors ALTER COLUMN writer SET DEFAULT '';
