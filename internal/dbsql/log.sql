-- log: the sequenced messages, numbered gap-free per (topic, partition) by
-- the sequencer (PendingSequence in pending.sql writes it). Subscribers read
-- it after their cursor; retention trims it below the lowest cursor. A
-- payload of 1 KiB or more is in bodies (body_id), the others inline.

-- name: LogRead
-- The batch after the cursor: $1 topic, $2 partition, $3 cursor, $4 limit.
-- Columns, in every LogRead statement: seq, uuid, key, metadata, payload
-- (from bodies when it is kept there), whether the payload is missing (its
-- bodies row is gone: the message cannot be delivered as it was written),
-- when it was published (its INSERT) and sequenced, and the delivery count
-- (NULL: not counted).
SELECT seq, uuid, coalesce(partition_key, ''), metadata,
	coalesce(payload, (SELECT b.payload FROM {{schema}}.bodies b WHERE b.id = body_id)),
	payload IS NULL AND NOT EXISTS (SELECT FROM {{schema}}.bodies b WHERE b.id = body_id), created_at, sequenced_at, NULL::int4
FROM {{schema}}.log
WHERE topic = $1 AND partition = $2 AND seq > $3 ORDER BY seq LIMIT $4;

-- name: LogReadCounting
-- The batch after the cursor, recording on the cursor row, before anything
-- is handed out, a delivery of its head and what is in flight (fenced by the
-- lease; only when the head exists), in one round trip that commits without
-- waiting for the WAL flush: a count lost with a server crash only forgets
-- one delivery. In flight: the head alone, or with $8 the whole batch (a
-- batch handler gets it at once); $9 says whether the delivery is the only
-- one in flight in its process (0009_crash_evidence.sql). $1 group,
-- $2 topic, $3 partition, $4 cursor, $5 lease owner, $6 lease token,
-- $7 limit. The count is on every row (NULL: not counted).
WITH counted AS (
	UPDATE {{schema}}.cursors c SET deliveries = greatest(c.deliveries, c.attempts) + 1,
		inflight_from = $4 + 1,
		inflight_to = CASE WHEN $8::boolean
			THEN (SELECT max(b.seq) FROM (SELECT seq FROM {{schema}}.log
				WHERE topic = $2 AND partition = $3 AND seq > $4 ORDER BY seq LIMIT $7) b)
			ELSE $4 + 1 END,
		inflight_solo = $9::boolean
	FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
	WHERE c.group_name = $1 AND c.topic = $2 AND c.partition = $3 AND c.seq = $4
		AND c.lease_owner = $5 AND c.lease_token = $6 AND c.lease_expires_at > clock_timestamp()
		AND EXISTS (SELECT 1 FROM {{schema}}.log WHERE topic = $2 AND partition = $3 AND seq = $4 + 1)
	RETURNING c.deliveries
)
SELECT seq, uuid, coalesce(partition_key, ''), metadata,
	coalesce(payload, (SELECT b.payload FROM {{schema}}.bodies b WHERE b.id = body_id)),
	payload IS NULL AND NOT EXISTS (SELECT FROM {{schema}}.bodies b WHERE b.id = body_id), created_at, sequenced_at,
	(SELECT deliveries FROM counted)
FROM {{schema}}.log
WHERE topic = $2 AND partition = $3 AND seq > $4 ORDER BY seq LIMIT $7;

-- name: LogReadCountingMany
-- LogReadCounting for several partitions at once: internal/pgcombine merges
-- the counted reads that meet in one round trip into this statement. $1
-- group; one array element per read, in one order: $2 topics, $3
-- partitions, $4 cursors, $5 lease owners, $6 lease tokens, $7 limits, $8
-- whole batch in flight, $9 solo. No two reads of one partition. Each row
-- starts with its read's ordinal (1 for the first element), followed by
-- LogReadCounting's columns; a read's rows come in seq order.
WITH r AS MATERIALIZED (
	SELECT * FROM unnest($2::text[], $3::int4[], $4::int8[], $5::text[], $6::int8[], $7::int4[], $8::boolean[], $9::boolean[])
		WITH ORDINALITY AS r(topic, part, after, owner, token, lim, whole, solo, i)
), counted AS (
	UPDATE {{schema}}.cursors c SET deliveries = greatest(c.deliveries, c.attempts) + 1,
		inflight_from = r.after + 1,
		inflight_to = CASE WHEN r.whole
			THEN (SELECT max(b.seq) FROM (SELECT seq FROM {{schema}}.log
				WHERE topic = r.topic AND partition = r.part AND seq > r.after ORDER BY seq LIMIT r.lim) b)
			ELSE r.after + 1 END,
		inflight_solo = r.solo
	FROM r, (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
	WHERE c.group_name = $1 AND c.topic = r.topic AND c.partition = r.part AND c.seq = r.after
		AND c.lease_owner = r.owner AND c.lease_token = r.token AND c.lease_expires_at > clock_timestamp()
		AND EXISTS (SELECT 1 FROM {{schema}}.log WHERE topic = r.topic AND partition = r.part AND seq = r.after + 1)
	RETURNING r.i, c.deliveries
)
SELECT r.i, l.seq, l.uuid, coalesce(l.partition_key, ''), l.metadata,
	coalesce(l.payload, (SELECT b.payload FROM {{schema}}.bodies b WHERE b.id = l.body_id)),
	l.payload IS NULL AND NOT EXISTS (SELECT FROM {{schema}}.bodies b WHERE b.id = l.body_id), l.created_at, l.sequenced_at,
	(SELECT n.deliveries FROM counted n WHERE n.i = r.i)
FROM r CROSS JOIN LATERAL (SELECT * FROM {{schema}}.log
	WHERE topic = r.topic AND partition = r.part AND seq > r.after ORDER BY seq LIMIT r.lim) l
ORDER BY r.i, l.seq;

-- name: LogReadSeqs
-- The held messages to retry (held.sql): $1 topic, $2 partition, $3 seqs.
SELECT seq, uuid, coalesce(partition_key, ''), metadata,
	coalesce(payload, (SELECT b.payload FROM {{schema}}.bodies b WHERE b.id = body_id)),
	payload IS NULL AND NOT EXISTS (SELECT FROM {{schema}}.bodies b WHERE b.id = body_id), created_at, sequenced_at, NULL::int4
FROM {{schema}}.log
WHERE topic = $1 AND partition = $2 AND seq = ANY($3::int8[]) ORDER BY seq;

-- name: LogTrim
-- Retention: deletes up to $4 messages of partition ($1 topic, $2 partition)
-- at or below the horizon $3 and sequenced before the cutoff $5 (NULL: no
-- KeepFor). The horizon is checked again against the cursors as of this
-- statement, so a group reset or created since the horizon was read is
-- respected, and so are messages held since (held.sql). The bodies of the
-- deleted messages go with them. Returns how many and the highest seq
-- deleted.
WITH d AS (
	DELETE FROM {{schema}}.log WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM {{schema}}.log
		WHERE topic = $1 AND partition = $2
			AND seq <= least($3::int8, (SELECT min({{schema}}.finished_seq(group_name, topic, partition, seq))
				FROM {{schema}}.cursors WHERE topic = $1 AND partition = $2))
			AND ($5::timestamptz IS NULL OR sequenced_at < $5)
		ORDER BY seq
		LIMIT $4))
	RETURNING seq, body_id
), bodies AS (
	DELETE FROM {{schema}}.bodies WHERE id = ANY(ARRAY(SELECT body_id FROM d WHERE body_id IS NOT NULL))
)
SELECT count(*), coalesce(max(seq), 0) FROM d;

-- name: LogOldestKept
-- Retention: the oldest message kept at or below the horizon. $1 topic,
-- $2 partition, $3 horizon.
SELECT seq, sequenced_at FROM {{schema}}.log
WHERE topic = $1 AND partition = $2 AND seq <= $3 ORDER BY seq LIMIT 1;
