-- pending: messages written by Publishers in their callers' transactions,
-- not yet numbered. The sequencer moves them into the log after commit.

-- name: PendingInsert
-- Many messages of one topic: $1 topic, then arrays of $2 partitions,
-- $3 partition keys ('' for none), $4 uuids, $5 metadata (JSON), $6 payloads.
-- A delayed message (metadata outbox_deliver_at, outbox.DeliverAt) gets
-- its deliver_at, and holds its key back unless it has none or is
-- unordered (0014_delayed.sql); the other publish statements do the same.
-- Rows keep the order given. A payload of 1 KiB or more goes into bodies
-- and the row carries its id (0007_bodies.sql says why); the threshold is
-- the same in every publish statement here.
WITH src AS MATERIALIZED (
	SELECT x.*, x.m::jsonb AS mj, CASE WHEN octet_length(x.b) >= 1024 THEN nextval('{{schema}}.bodies_id_seq') END AS body_id
	FROM unnest($2::int4[], $3::text[], $4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS x(p, k, u, m, b, ord)
), bodies AS (
	INSERT INTO {{schema}}.bodies (id, payload) SELECT body_id, b FROM src WHERE body_id IS NOT NULL
)
INSERT INTO {{schema}}.pending (topic, partition, partition_key, uuid, metadata, payload, body_id, deliver_at, holds)
SELECT $1, p, NULLIF(k, ''), u, mj, CASE WHEN body_id IS NULL THEN b END, body_id,
	(mj ->> 'outbox_deliver_at')::timestamptz, mj ? 'outbox_deliver_at' AND k <> '' AND NOT mj ? 'outbox_unordered'
FROM src ORDER BY ord;

-- name: PendingInsertNotify
-- PendingInsert, and a notification on channel $7 that wakes the sequencer
-- when the transaction commits.
WITH src AS MATERIALIZED (
	SELECT x.*, x.m::jsonb AS mj, CASE WHEN octet_length(x.b) >= 1024 THEN nextval('{{schema}}.bodies_id_seq') END AS body_id
	FROM unnest($2::int4[], $3::text[], $4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS x(p, k, u, m, b, ord)
), bodies AS (
	INSERT INTO {{schema}}.bodies (id, payload) SELECT body_id, b FROM src WHERE body_id IS NOT NULL
), ins AS (
	INSERT INTO {{schema}}.pending (topic, partition, partition_key, uuid, metadata, payload, body_id, deliver_at, holds)
	SELECT $1, p, NULLIF(k, ''), u, mj, CASE WHEN body_id IS NULL THEN b END, body_id,
		(mj ->> 'outbox_deliver_at')::timestamptz, mj ? 'outbox_deliver_at' AND k <> '' AND NOT mj ? 'outbox_unordered'
	FROM src ORDER BY ord
) SELECT pg_notify($7, '');

-- name: PendingInsertOne
-- One message: $1 topic, $2 partition, $3 partition key ('' for none),
-- $4 uuid, $5 metadata (JSON), $6 payload (into bodies from 1 KiB on, as in
-- PendingInsert).
WITH body AS (
	INSERT INTO {{schema}}.bodies (id, payload)
	SELECT nextval('{{schema}}.bodies_id_seq'), $6::bytea WHERE octet_length($6::bytea) >= 1024
	RETURNING id
)
INSERT INTO {{schema}}.pending (topic, partition, partition_key, uuid, metadata, payload, body_id, deliver_at, holds)
SELECT $1, $2, NULLIF($3, ''), $4, md, CASE WHEN octet_length($6::bytea) < 1024 THEN $6::bytea END, (SELECT id FROM body),
	(md ->> 'outbox_deliver_at')::timestamptz, md ? 'outbox_deliver_at' AND $3 <> '' AND NOT md ? 'outbox_unordered'
FROM (SELECT $5::jsonb AS md) x;

-- name: PendingInsertOneNotify
-- PendingInsertOne, and a notification on channel $7.
WITH body AS (
	INSERT INTO {{schema}}.bodies (id, payload)
	SELECT nextval('{{schema}}.bodies_id_seq'), $6::bytea WHERE octet_length($6::bytea) >= 1024
	RETURNING id
), ins AS (
	INSERT INTO {{schema}}.pending (topic, partition, partition_key, uuid, metadata, payload, body_id, deliver_at, holds)
	SELECT $1, $2, NULLIF($3, ''), $4, md, CASE WHEN octet_length($6::bytea) < 1024 THEN $6::bytea END, (SELECT id FROM body),
		(md ->> 'outbox_deliver_at')::timestamptz, md ? 'outbox_deliver_at' AND $3 <> '' AND NOT md ? 'outbox_unordered'
	FROM (SELECT $5::jsonb AS md) x
) SELECT pg_notify($7, '');

-- name: PendingInsertRelayed
-- The log-based mode's relay puts messages that must wait into pending (in
-- its append's transaction): delayed ones whose time has not come, and the
-- later messages of their keys. Arrays of $1 topics, $2 partitions, $3 keys
-- ('' for none), $4 uuids, $5 metadata (JSON), $6 payloads, $7 commit times
-- (created_at), $8 delivery times (NULL: not delayed), $9 whether each
-- holds its key back. The sequencer moves them when they are due.
INSERT INTO {{schema}}.pending (topic, partition, partition_key, uuid, metadata, payload, created_at, deliver_at, holds)
SELECT t, p, NULLIF(k, ''), u, m::jsonb, b, at, due, h
FROM unnest($1::text[], $2::int4[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::timestamptz[], $8::timestamptz[], $9::bool[])
	WITH ORDINALITY AS x(t, p, k, u, m, b, at, due, h, ord)
ORDER BY ord;

-- name: PendingHeldKeys
-- The keys (topic, key) whose messages wait in pending behind a delayed
-- message: every row that holds its key back, due or not (the log-based
-- relay puts the later messages of these keys into pending too).
SELECT DISTINCT topic, partition_key FROM {{schema}}.pending WHERE holds;

-- name: PendingSequence
-- The sequencer's second statement, run with a snapshot taken after
-- PartitionsLockPending's locks were granted, so it sees every row and every
-- last_seq committed by the partitions' previous sequencers. It moves the
-- oldest pending rows of the locked partitions ($1 topics, $2 partitions;
-- at most $3 rows, in id order, so each partition gets a prefix of its own
-- rows) into the log, numbering each partition's rows from last_seq + 1, and
-- returns per topic how many moved, the most in one partition and the age
-- in seconds of the oldest message moved (from its INSERT, or from its
-- delivery time for a delayed message, to now: a delay is not a sequencing
-- delay). Unless the
-- channel $4 is NULL, it also notifies it once per topic, with the payload
-- "topic:p1,p2,..." (the partitions that got messages), which wakes the
-- subscribers when the transaction commits. For the links of the pass's
-- span, unless $5 is 0 (tracing is off: nothing more is read), it returns
-- per topic how many messages moved carry trace context (a metadata key of
-- $6, the propagator's fields), and the distinct trace contexts of the
-- first $5 of them, each a JSON object of those keys. $7 is the
-- sequencer's clock: a delayed message moves once its time has come and no
-- earlier message of its key holds it back (pending_movable); while no
-- message is delayed, one probe of the pending_delayed index says so and
-- the rest is not evaluated.
WITH locked AS (
	SELECT * FROM unnest($1::text[], $2::int4[]) AS l(topic, partition)
), picked AS (
	SELECT m.ctid AS tid FROM {{schema}}.pending m
	WHERE (m.topic, m.partition) IN (SELECT topic, partition FROM locked)
		AND (NOT EXISTS (SELECT 1 FROM {{schema}}.pending d WHERE d.deliver_at IS NOT NULL)
			OR {{schema}}.pending_movable(m.topic, m.partition_key, m.id, m.deliver_at, m.metadata ? 'outbox_unordered', $7))
	ORDER BY m.id LIMIT $3
), moved AS (
	-- By row address: a TID scan, whatever the size of the backlog.
	-- Pending rows are never updated, and rows deleted by an earlier
	-- sequencer are invisible to this snapshot, so the addresses are
	-- exactly the rows picked.
	DELETE FROM {{schema}}.pending d
	WHERE d.ctid = ANY (ARRAY(SELECT tid FROM picked))
	RETURNING d.*
), numbered AS (
	SELECT mv.*, p.last_seq + row_number() OVER (PARTITION BY mv.topic, mv.partition ORDER BY mv.id) AS seq
	FROM moved mv JOIN {{schema}}.partitions p ON p.topic = mv.topic AND p.partition = mv.partition
), inserted AS (
	INSERT INTO {{schema}}.log (topic, partition, seq, partition_key, uuid, metadata, payload, body_id, created_at)
	SELECT topic, partition, seq, partition_key, uuid, metadata, payload, body_id, created_at
	FROM numbered ORDER BY topic, partition, seq
	RETURNING topic, partition, seq
), advanced AS (
	UPDATE {{schema}}.partitions p SET last_seq = x.max_seq, sequenced_at = now()
	FROM (SELECT topic, partition, max(seq) AS max_seq, count(*) AS n FROM inserted GROUP BY topic, partition) x
	WHERE p.topic = x.topic AND p.partition = x.partition
	RETURNING p.topic, p.partition, x.n
)
SELECT a.topic, sum(a.n)::bigint, max(a.n)::bigint,
	CASE WHEN $4::text IS NOT NULL THEN pg_notify($4, a.topic || ':' || string_agg(a.partition::text, ',')) END::text,
	(SELECT greatest(extract(epoch FROM clock_timestamp() - min(greatest(mv.created_at, mv.deliver_at))), 0) FROM moved mv WHERE mv.topic = a.topic)::float8,
	CASE WHEN $5::int4 > 0 THEN (SELECT count(*) FROM moved mv WHERE mv.topic = a.topic AND mv.metadata ?| $6::text[]) ELSE 0 END::int8,
	CASE WHEN $5::int4 > 0 THEN ARRAY(
		SELECT x.carrier FROM (
			SELECT mv.id, (SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each_text(mv.metadata) e WHERE e.key = ANY ($6::text[]))::text AS carrier
			FROM moved mv WHERE mv.topic = a.topic AND mv.metadata ?| $6::text[]
		) x GROUP BY x.carrier ORDER BY min(x.id) LIMIT $5::int4)
	END::text[]
FROM advanced a GROUP BY a.topic;

-- name: PendingForwardRead
-- A forwarder-only topic's forwarder reads what it forwards next, for all
-- the partitions it holds in one statement: $1 topic, $2 partitions, $3 at
-- most this many rows per partition, $4 the forwarder's clock (a delayed
-- message is read once its time has come and no earlier message of its
-- key holds it back, as PendingSequence moves them). Each partition's
-- committed rows come in id order (the order PendingSequence numbers them
-- in), so each read is a prefix of the partition's rows: the forwarder
-- numbers them from its cursor. Columns: partition, id, uuid, key ('' for
-- none), metadata, payload (from bodies from 1 KiB on), whether the payload
-- is missing (its bodies row is gone), created_at.
SELECT p.part, m.id, m.uuid, coalesce(m.partition_key, ''), m.metadata,
	coalesce(m.payload, (SELECT b.payload FROM {{schema}}.bodies b WHERE b.id = m.body_id)),
	m.payload IS NULL AND NOT EXISTS (SELECT FROM {{schema}}.bodies b WHERE b.id = m.body_id),
	m.created_at
FROM unnest($2::int4[]) AS p(part) CROSS JOIN LATERAL (
	SELECT * FROM {{schema}}.pending x
	WHERE x.topic = $1 AND x.partition = p.part
		AND (NOT EXISTS (SELECT 1 FROM {{schema}}.pending d WHERE d.deliver_at IS NOT NULL)
			OR {{schema}}.pending_movable(x.topic, x.partition_key, x.id, x.deliver_at, x.metadata ? 'outbox_unordered', $4))
	ORDER BY x.id LIMIT $3
) m
ORDER BY p.part, m.id;

-- name: PendingForwarded
-- A forwarder-only topic's forwarder records a round forwarded, in one
-- statement for all its partitions, in the transaction that ends the
-- round: each partition's cursor moves to its last seq forwarded, fenced
-- by the lease, and that partition's rows forwarded leave pending (and
-- bodies), and partitions.last_seq follows. $1 group, $2 topic, $3 lease
-- owner; one element per partition: $4 partitions, $5 lease tokens, $6
-- last seqs; one element per row forwarded: $7 its partition, $8 its
-- pending id (looked up by the primary key). A partition whose lease is
-- gone (another instance took it, or it expired) or whose cursor is past
-- its last seq moves nothing and deletes nothing: the statement returns
-- the partitions that moved. Rows already gone (another owner's tail read
-- deleted them) are skipped.
WITH moved AS (
	UPDATE {{schema}}.cursors c SET seq = r.last, attempts = 0, unexplained = 0, deliveries = 0,
		inflight_from = 0, inflight_to = 0, inflight_solo = false,
		backoff_until = NULL, last_error = NULL, last_error_at = NULL, updated_at = clock_timestamp()
	FROM unnest($4::int4[], $5::int8[], $6::int8[]) AS r(part, token, last)
	WHERE c.group_name = $1 AND c.topic = $2 AND c.partition = r.part AND c.lease_owner = $3
		AND c.lease_token = r.token AND c.lease_expires_at > clock_timestamp() AND c.seq <= r.last
	RETURNING r.part, r.last
), gone AS (
	DELETE FROM {{schema}}.pending m
	USING unnest($7::int4[], $8::int8[]) AS x(part, id)
	WHERE m.id = x.id AND x.part IN (SELECT part FROM moved) AND m.topic = $2 AND m.partition = x.part
	RETURNING m.body_id
), bodies AS (
	DELETE FROM {{schema}}.bodies b WHERE b.id IN (SELECT body_id FROM gone WHERE body_id IS NOT NULL)
), advanced AS (
	UPDATE {{schema}}.partitions p SET last_seq = greatest(p.last_seq, moved.last), sequenced_at = now()
	FROM moved WHERE p.topic = $2 AND p.partition = moved.part
)
SELECT part FROM moved ORDER BY part;

-- name: PendingMetrics
-- Metrics and admin status: per topic, every registered one included (0s
-- and NULL when nothing waits), the messages waiting for a seq, the age in
-- seconds of the oldest of them that could be sequenced now (a delayed
-- message counts from its time, not its INSERT), how many are delayed
-- (their time has not come), how many cannot be sequenced yet (those, and
-- the later messages of their keys), and when the earliest delayed one is
-- due. While no message is delayed, one probe of pending_delayed says so
-- and pending_movable is not evaluated.
SELECT coalesce(t.name, m.topic), count(m.topic)::int8,
	coalesce(extract(epoch FROM now() - min(m.ready)), 0)::float8,
	(count(m.topic) FILTER (WHERE m.deliver_at > now()))::int8,
	(count(m.topic) FILTER (WHERE m.topic IS NOT NULL AND m.ready IS NULL))::int8,
	min(m.deliver_at) FILTER (WHERE m.deliver_at > now())
FROM {{schema}}.topics t FULL JOIN (
	SELECT p.topic, p.deliver_at,
		CASE WHEN NOT EXISTS (SELECT 1 FROM {{schema}}.pending d WHERE d.deliver_at IS NOT NULL)
			OR {{schema}}.pending_movable(p.topic, p.partition_key, p.id, p.deliver_at, p.metadata ? 'outbox_unordered', now())
		THEN greatest(p.created_at, p.deliver_at) END AS ready
	FROM {{schema}}.pending p
) m ON m.topic = t.name
GROUP BY 1;

-- name: PendingAny
-- Whether any committed message waits for the sequencer: one round trip,
-- instead of a pass's three, for the sequencer's unprompted passes (which
-- usually find nothing). Through the primary key, as the pass itself reads
-- pending: a sequential scan would step over every dead row a busy table
-- has not vacuumed yet (10 ms a call was measured).
-- $1 is the sequencer's clock: a message that waits for its time (or behind
-- one of its key that does) is not work; the second column is the earliest
-- time a delayed message is due after $1 (NULL: none), when the sequencer
-- wakes by itself. The messages of forwarder-only topics are their
-- forwarders' (PendingForwardRead), not the sequencer's.
SELECT EXISTS (SELECT 1 FROM {{schema}}.pending m
		WHERE (NOT EXISTS (SELECT 1 FROM {{schema}}.pending d WHERE d.deliver_at IS NOT NULL)
				OR {{schema}}.pending_movable(m.topic, m.partition_key, m.id, m.deliver_at, m.metadata ? 'outbox_unordered', $1))
			AND m.topic NOT IN (SELECT name FROM {{schema}}.topics WHERE forward_only)
		ORDER BY m.id LIMIT 1),
	(SELECT min(deliver_at) FROM {{schema}}.pending
		WHERE deliver_at > $1 AND topic NOT IN (SELECT name FROM {{schema}}.topics WHERE forward_only));

-- name: PendingCanVacuum
-- Whether the current role may VACUUM pending ($1 the schema): its owner,
-- a member of the owner's role, or a superuser. Another role's VACUUM
-- skips the table with a warning the driver does not show, so the
-- sequencer asks first and otherwise leaves pending to autovacuum.
SELECT coalesce(bool_or(pg_has_role(c.relowner, 'MEMBER')), false)
	OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = 'pending';

-- name: PendingVacuum
-- The sequencer's own vacuum, every queuevacuum.Every rows it moved: of
-- pending, so that it holds at most about that many dead rows whatever
-- autovacuum's pace, and of the two small tables updated all the time,
-- partitions (by the sequencer) and cursors (by the consumers), whose
-- updates are HOT as long as their pages have room: pruning frees that room
-- but does not tell the free space map, so the few updates that find a page
-- full go to a new page at the end of the table, which grows a few pages a
-- minute until a vacuum records the space (their dead rows, pruned, rarely
-- reach autovacuum's threshold). SKIP_LOCKED: a table another instance's
-- sequencer or autovacuum is vacuuming already is skipped, not waited for.
-- Not in a transaction, which VACUUM refuses.
VACUUM (SKIP_LOCKED) {{schema}}.pending, {{schema}}.partitions, {{schema}}.cursors;
