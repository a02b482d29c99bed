-- dead_letters: messages taken out of delivery (rejected, out of attempts,
-- or added from elsewhere), with their reason and state: pending, replayed
-- or discarded. Every statement that reads entries returns the same
-- columns, in the order deadletter.scanEntry reads them.
--
-- The list filters take: $1 group, $2 topic ('' for any), $3 statuses
-- (empty for any), $4 created at or after, $5 created before (NULL for no
-- bound).

-- name: DeadLettersInsert
-- Stores a message; a second write of the same message (group, topic,
-- partition, seq; or group, topic, uuid for an external one) is a no-op and
-- returns no row. First and last failure default to each other, then now().
INSERT INTO {{schema}}.dead_letters (group_name, topic, partition, seq, uuid, partition_key, metadata,
	payload, reason, attempts, first_failure_at, last_failure_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, coalesce($11, $12, now()), coalesce($12, $11, now()))
ON CONFLICT DO NOTHING
RETURNING id;

-- name: DeadLettersListAscending
-- A page of entries in id order: the filter $1..$5, $6 the last id of the
-- previous page (NULL: from the start), $7 limit.
SELECT id, group_name, topic, partition, seq, uuid, coalesce(partition_key, ''), metadata, payload, reason,
	attempts, first_failure_at, last_failure_at, status, coalesce(replay_topic, ''), coalesce(replay_uuid, ''),
	created_at, updated_at
FROM {{schema}}.dead_letters
WHERE ($1 = '' OR group_name = $1) AND ($2 = '' OR topic = $2)
	AND (coalesce(cardinality($3::text[]), 0) = 0 OR status = ANY($3::text[]))
	AND ($4::timestamptz IS NULL OR created_at >= $4) AND ($5::timestamptz IS NULL OR created_at < $5)
	AND ($6::int8 IS NULL OR id > $6)
ORDER BY id ASC LIMIT $7;

-- name: DeadLettersListDescending
-- DeadLettersListAscending, newest first: $6 bounds from above.
SELECT id, group_name, topic, partition, seq, uuid, coalesce(partition_key, ''), metadata, payload, reason,
	attempts, first_failure_at, last_failure_at, status, coalesce(replay_topic, ''), coalesce(replay_uuid, ''),
	created_at, updated_at
FROM {{schema}}.dead_letters
WHERE ($1 = '' OR group_name = $1) AND ($2 = '' OR topic = $2)
	AND (coalesce(cardinality($3::text[]), 0) = 0 OR status = ANY($3::text[]))
	AND ($4::timestamptz IS NULL OR created_at >= $4) AND ($5::timestamptz IS NULL OR created_at < $5)
	AND ($6::int8 IS NULL OR id < $6)
ORDER BY id DESC LIMIT $7;

-- name: DeadLettersCount
-- How many entries the filter $1..$5 selects.
SELECT count(*) FROM {{schema}}.dead_letters
WHERE ($1 = '' OR group_name = $1) AND ($2 = '' OR topic = $2)
	AND (coalesce(cardinality($3::text[]), 0) = 0 OR status = ANY($3::text[]))
	AND ($4::timestamptz IS NULL OR created_at >= $4) AND ($5::timestamptz IS NULL OR created_at < $5);

-- name: DeadLettersGet
-- Entry $1.
SELECT id, group_name, topic, partition, seq, uuid, coalesce(partition_key, ''), metadata, payload, reason,
	attempts, first_failure_at, last_failure_at, status, coalesce(replay_topic, ''), coalesce(replay_uuid, ''),
	created_at, updated_at
FROM {{schema}}.dead_letters WHERE id = $1;

-- name: DeadLettersGetForUpdate
-- Entry $1, locked until the transaction ends.
SELECT id, group_name, topic, partition, seq, uuid, coalesce(partition_key, ''), metadata, payload, reason,
	attempts, first_failure_at, last_failure_at, status, coalesce(replay_topic, ''), coalesce(replay_uuid, ''),
	created_at, updated_at
FROM {{schema}}.dead_letters WHERE id = $1 FOR UPDATE;

-- name: DeadLettersMarkReplayed
-- Entry $1 was published again to topic $2 as message $3.
UPDATE {{schema}}.dead_letters
SET status = 'replayed', replay_topic = $2, replay_uuid = $3, updated_at = clock_timestamp()
WHERE id = $1
RETURNING id, group_name, topic, partition, seq, uuid, coalesce(partition_key, ''), metadata, payload, reason,
	attempts, first_failure_at, last_failure_at, status, coalesce(replay_topic, ''), coalesce(replay_uuid, ''),
	created_at, updated_at;

-- name: DeadLettersDiscard
-- Marks pending entry $1 discarded; no row when it is not pending.
UPDATE {{schema}}.dead_letters
SET status = 'discarded', updated_at = clock_timestamp()
WHERE id = $1 AND status = 'pending'
RETURNING id, group_name, topic, partition, seq, uuid, coalesce(partition_key, ''), metadata, payload, reason,
	attempts, first_failure_at, last_failure_at, status, coalesce(replay_topic, ''), coalesce(replay_uuid, ''),
	created_at, updated_at;

-- name: DeadLettersPurge
-- Deletes up to $3 of the oldest entries in states $1 (empty for any)
-- created before $2, of group $4 and topic $5 ('' for any).
DELETE FROM {{schema}}.dead_letters WHERE id = ANY(ARRAY(
	SELECT id FROM {{schema}}.dead_letters
	WHERE (coalesce(cardinality($1::text[]), 0) = 0 OR status = ANY($1::text[])) AND created_at < $2
		AND ($4::text = '' OR group_name = $4) AND ($5::text = '' OR topic = $5)
	ORDER BY id LIMIT $3));

-- name: DeadLettersDeleteGroup
-- Admin: deletes group $1's entries (topic $2 or '' for all).
DELETE FROM {{schema}}.dead_letters WHERE group_name = $1 AND ($2 = '' OR topic = $2);

-- name: DeadLettersMetrics
-- Metrics: the entries per group, topic and status.
SELECT group_name, topic, status, count(*)::int8 FROM {{schema}}.dead_letters GROUP BY group_name, topic, status;

-- name: DeadLettersPurgeResolved
-- Retention: deletes up to $2 entries dealt with (replayed or discarded)
-- whose last change is older than $1 (a duration in µs, by the server's
-- clock); pending entries are never deleted here. Returns how many.
WITH d AS (
	DELETE FROM {{schema}}.dead_letters WHERE id = ANY(ARRAY(
		SELECT id FROM {{schema}}.dead_letters
		WHERE status IN ('replayed', 'discarded') AND updated_at < now() - $1::int8 * interval '1 microsecond'
		ORDER BY id LIMIT $2))
	RETURNING 1
)
SELECT count(*) FROM d;
