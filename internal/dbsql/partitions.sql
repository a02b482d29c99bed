-- partitions: one row per (topic, partition) with its last seq and when the
-- sequencer last moved messages into it. Created with the topic
-- (TopicsRegister); last_seq is advanced by PendingSequence.

-- name: PartitionsLockPending
-- The sequencer's first statement: locks the partitions of the oldest
-- pending messages ($2 rows looked at) that no other sequencer holds, least
-- recently sequenced first, at most $1 of them.
SELECT p.topic, p.partition FROM {{schema}}.partitions p
WHERE (p.topic, p.partition) IN (
	SELECT DISTINCT w.topic, w.partition FROM (
		SELECT topic, partition FROM {{schema}}.pending ORDER BY id LIMIT $2
	) w
)
ORDER BY p.sequenced_at NULLS FIRST
LIMIT $1
FOR UPDATE OF p SKIP LOCKED;
