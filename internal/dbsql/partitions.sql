-- partitions: one row per (topic, partition) with its last seq and when the
-- sequencer last moved messages into it. Created with the topic
-- (TopicsRegister); last_seq is advanced by PendingSequence.

-- name: PartitionsLockPending
-- The sequencer's first statement: locks the partitions of the oldest
-- pending messages ($2 rows looked at) that no other sequencer holds, least
-- recently sequenced first, at most $1 of them. A delayed message whose
-- time ($3, the sequencer's clock) has not come, or one its key waits
-- behind, is not looked at (PendingSequence says more), nor are the
-- messages of a forwarder-only topic, which its forwarder takes from
-- pending itself (PendingForwardRead).
SELECT p.topic, p.partition FROM {{schema}}.partitions p
WHERE (p.topic, p.partition) IN (
	SELECT DISTINCT w.topic, w.partition FROM (
		SELECT m.topic, m.partition FROM {{schema}}.pending m
		WHERE (NOT EXISTS (SELECT 1 FROM {{schema}}.pending d WHERE d.deliver_at IS NOT NULL)
				OR {{schema}}.pending_movable(m.topic, m.partition_key, m.id, m.deliver_at, m.metadata ? 'outbox_unordered', $3))
			AND m.topic NOT IN (SELECT name FROM {{schema}}.topics WHERE forward_only)
		ORDER BY m.id LIMIT $2
	) w
)
ORDER BY p.sequenced_at NULLS FIRST
LIMIT $1
FOR UPDATE OF p SKIP LOCKED;
