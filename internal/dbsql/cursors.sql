-- cursors: one row per (consumer group, topic, partition): how far the group
-- has got (seq, the last message finished), who holds the partition's lease
-- (lease_owner, lease_token, lease_expires_at), the head message's attempts
-- and deliveries, its backoff and last error, pause state, the adaptive
-- batching state and the partition's writer into a forwarder's target
-- (0015_cursor_writer.sql). Every statement that moves a cursor or a lease
-- is here.
--
-- Durations travel as microseconds: $n::int8 * interval '1 microsecond'.
-- Fenced writes compare with clock_timestamp(), not now(): they may run late
-- in a long transaction, whose now() is its start.

-- name: CursorsCreate
-- Creates the group's cursors of a topic, if missing. $1 group, $2 topic,
-- $3 partitions, $4 start from newest (the partition's last_seq, else 0).
INSERT INTO {{schema}}.cursors (group_name, topic, partition, seq)
SELECT $1, $2, g, CASE WHEN $4::boolean THEN coalesce(p.last_seq, 0) ELSE 0 END
FROM generate_series(0, $3::int4 - 1) AS g
LEFT JOIN {{schema}}.partitions p ON p.topic = $2 AND p.partition = g
ON CONFLICT (group_name, topic, partition) DO NOTHING;

-- name: CursorsBalance
-- A member's heartbeat, with its TTL (it is live until heartbeat_at +
-- ttl), then what it needs to rebalance: the other live members (each by
-- its own TTL), the number of partitions not paused, the paused
-- partitions this member holds, and in how many µs the first of the other
-- live members expires unless it heartbeats (0: none live), so that a
-- member that balances seldom looks again when a crashed one's partitions
-- come free. A member that joins (no row, or its last heartbeat expired)
-- notifies the group's change on channel $7 (names.MembersChannel; NULL:
-- none): members balance at once. $1 group, $2 topic, $3 me, $4 TTL in µs,
-- $5 partitions, $6 whether this member can reject (it has a
-- RejectHandler). The CTE "was" reads the row as it was before the
-- heartbeat.
WITH was AS (
	SELECT heartbeat_at + ttl > now() AS live FROM {{schema}}.members
	WHERE group_name = $1 AND topic = $2 AND member_id = $3
), hb AS (
	INSERT INTO {{schema}}.members (group_name, topic, member_id, heartbeat_at, ttl, can_reject)
	VALUES ($1, $2, $3, now(), $4::int8 * interval '1 microsecond', $6)
	ON CONFLICT (group_name, topic, member_id) DO UPDATE SET heartbeat_at = now(), ttl = excluded.ttl, can_reject = $6
	RETURNING NOT EXISTS (SELECT 1 FROM was WHERE was.live) AS joined
)
SELECT
	ARRAY(SELECT member_id FROM {{schema}}.members WHERE group_name = $1 AND topic = $2 AND member_id <> $3
		AND heartbeat_at + ttl > now()),
	(SELECT count(*) FROM {{schema}}.cursors WHERE group_name = $1 AND topic = $2 AND partition < $5 AND NOT paused),
	ARRAY(SELECT partition FROM {{schema}}.cursors WHERE group_name = $1 AND topic = $2 AND paused AND lease_owner = $3),
	coalesce((SELECT ceil(extract(epoch FROM min(heartbeat_at + ttl) - now()) * 1000000)::int8 FROM {{schema}}.members
		WHERE group_name = $1 AND topic = $2 AND member_id <> $3 AND heartbeat_at + ttl > now()), 0),
	(SELECT count(pg_notify($7, $2 || ':' || $1)) FROM hb WHERE hb.joined AND $7::text IS NOT NULL)::int8;

-- name: CursorsAcquire
-- Takes free or expired leases, never a live one. $1 group, $2 topic, $3 me,
-- $4 partitions, $5 excluded partitions, $6 TTL in µs, $7 how many. Each
-- member scans in its own hash order, so that members starting together do
-- not contend for the same rows. A delivery the last holder left in flight
-- (it died, was killed or froze past its lease) is settled here
-- (0009_crash_evidence.sql): charged to the head as a failed attempt, with
-- the head's unexplained deliveries, when it was the only delivery in
-- flight in its process; otherwise charged to nobody, its messages made
-- suspects, to be delivered alone. Returns the partition, token, cursor,
-- attempts, the attempts charged now, the last error, the backoff left in
-- seconds, the suspects (from, to; 0 for none) and whether this
-- acquisition found an unexplained crash. The free rows are picked once, in
-- a materialized CTE: as a subquery of the UPDATE's FROM, the planner may
-- scan it again for each cursor row, and a scan after the UPDATE changed
-- the rows it picked first skips them (changed by this command) and picks
-- others, taking more than $7 leases.
WITH free AS MATERIALIZED (
	SELECT partition, attempts AS old_attempts,
		inflight_to > seq AND inflight_solo AND inflight_from = seq + 1 AND inflight_to = seq + 1 AS solo,
		inflight_to > seq AND NOT (inflight_solo AND inflight_from = seq + 1 AND inflight_to = seq + 1) AS unexplained
	FROM {{schema}}.cursors
	WHERE group_name = $1 AND topic = $2 AND partition < $4 AND NOT paused
		AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= now())
		AND partition <> ALL($5::int4[])
	ORDER BY hashtext($3 || ':' || partition::text), partition
	LIMIT $7
	FOR UPDATE SKIP LOCKED)
UPDATE {{schema}}.cursors c
SET lease_owner = $3, lease_token = c.lease_token + 1, lease_expires_at = now() + $6::int8 * interval '1 microsecond',
	attempts = CASE WHEN free.solo THEN least(c.attempts + 1 + c.unexplained, 2147483646) ELSE c.attempts END,
	unexplained = CASE WHEN free.solo THEN 0
		WHEN free.unexplained AND c.seq + 1 BETWEEN c.inflight_from AND c.inflight_to THEN c.unexplained + 1
		ELSE c.unexplained END,
	suspect_from = CASE WHEN NOT free.unexplained THEN c.suspect_from
		WHEN c.suspect_to > c.seq THEN least(c.suspect_from, greatest(c.inflight_from, c.seq + 1))
		ELSE greatest(c.inflight_from, c.seq + 1) END,
	suspect_to = CASE WHEN free.unexplained THEN greatest(c.suspect_to, c.inflight_to) ELSE c.suspect_to END,
	inflight_from = 0, inflight_to = 0, inflight_solo = false,
	last_error = CASE WHEN free.solo
		THEN format('seq %s: the consumer process died while this message was the only delivery in flight in it (delivery %s)', c.seq + 1, c.deliveries)
		WHEN free.unexplained AND c.last_error IS NULL
		THEN format('seq %s..%s: the consumer process died with other deliveries in flight: nobody is charged; these messages are delivered alone until the one that crashes it is found', c.inflight_from, c.inflight_to)
		ELSE c.last_error END,
	last_error_at = CASE WHEN free.solo OR (free.unexplained AND c.last_error IS NULL) THEN clock_timestamp() ELSE c.last_error_at END
FROM free
WHERE c.group_name = $1 AND c.topic = $2 AND c.partition = free.partition
RETURNING c.partition, c.lease_token, c.seq, c.attempts, c.attempts - free.old_attempts,
	coalesce(c.last_error, ''),
	coalesce(greatest(extract(epoch FROM c.backoff_until - clock_timestamp()), 0), 0)::float8,
	CASE WHEN c.suspect_to > c.seq THEN c.suspect_from ELSE 0 END,
	CASE WHEN c.suspect_to > c.seq THEN c.suspect_to ELSE 0 END,
	free.unexplained;

-- name: CursorsRenew
-- Renews the unexpired leases given (renewed = true). $1 group, $2 topic,
-- $3 me, $4 partitions, $5 tokens, $6 TTL in µs. A row locked by a
-- transaction (typically our worker's, between Advance and commit) is
-- skipped rather than waited for, and reported with renewed = false if it is
-- still ours: nobody else can acquire it while it is locked. A partition
-- missing from the result is lost.
WITH mine AS (
	SELECT partition FROM {{schema}}.cursors
	WHERE group_name = $1 AND topic = $2 AND lease_owner = $3
		AND (partition, lease_token) IN (SELECT * FROM unnest($4::int4[], $5::int8[]))
	FOR UPDATE SKIP LOCKED
), renewed AS (
	UPDATE {{schema}}.cursors c SET lease_expires_at = now() + $6::int8 * interval '1 microsecond'
	FROM mine
	WHERE c.group_name = $1 AND c.topic = $2 AND c.partition = mine.partition AND c.lease_expires_at > now()
	RETURNING c.partition
)
SELECT partition, true FROM renewed
UNION ALL
SELECT partition, false FROM {{schema}}.cursors
WHERE group_name = $1 AND topic = $2 AND lease_owner = $3
	AND (partition, lease_token) IN (SELECT * FROM unnest($4::int4[], $5::int8[]))
	AND lease_expires_at > now()
	AND partition NOT IN (SELECT partition FROM mine);

-- name: CursorsRelease
-- Gives leases back. $1 group, $2 topic, $3 me, $4 partitions, $5 tokens.
-- Fenced by owner and token. A row locked by a transaction is skipped, not
-- waited for; the partitions released are returned, and CursorsStillHeld
-- tells a skipped lease (released again later) from one lost meanwhile.
-- When it released any, it notifies the group's change on channel $6
-- (names.MembersChannel; NULL: none): a member waiting for its share takes
-- them at once.
WITH released AS (
	UPDATE {{schema}}.cursors c SET lease_owner = NULL, lease_expires_at = NULL
	WHERE c.group_name = $1 AND c.topic = $2 AND c.partition IN (
		SELECT partition FROM {{schema}}.cursors
		WHERE group_name = $1 AND topic = $2 AND lease_owner = $3
			AND (partition, lease_token) IN (SELECT * FROM unnest($4::int4[], $5::int8[]))
		FOR UPDATE SKIP LOCKED)
	RETURNING c.partition
), announced AS (
	SELECT count(pg_notify($6, $2 || ':' || $1)) FROM (SELECT 1 FROM released LIMIT 1) x WHERE $6::text IS NOT NULL
)
SELECT r.partition FROM released r, announced;

-- name: CursorsStillHeld
-- Of the leases given ($4 partitions, $5 tokens), those member $3 still
-- holds unexpired in group $1 and topic $2: after CursorsRelease skipped
-- their rows (locked by a transaction), to be released again. A plain read:
-- it waits for no lock.
SELECT partition FROM {{schema}}.cursors
WHERE group_name = $1 AND topic = $2 AND lease_owner = $3
	AND (partition, lease_token) IN (SELECT * FROM unnest($4::int4[], $5::int8[]))
	AND lease_expires_at > now();

-- name: CursorsWriter
-- The partition's writer into a forwarder's target (NULL: from before
-- writer records), when the lease is still member $4's with token $5,
-- unexpired: no row otherwise. $1 group, $2 topic, $3 partition. A plain
-- read: it waits for no lock.
SELECT writer FROM {{schema}}.cursors
WHERE group_name = $1 AND topic = $2 AND partition = $3 AND lease_owner = $4 AND lease_token = $5
	AND lease_expires_at > clock_timestamp();

-- name: CursorsSetWriter
-- Records $6 as the partition's writer, fenced like CursorsAdvance: $1
-- group, $2 topic, $3 partition, $4 me, $5 token. A synchronous statement
-- of its own: a record lost in a crash would leave a writer unfenced.
UPDATE {{schema}}.cursors SET writer = $6
WHERE group_name = $1 AND topic = $2 AND partition = $3 AND lease_owner = $4 AND lease_token = $5
	AND lease_expires_at > clock_timestamp();

-- name: CursorsAdvance
-- Moves the cursor to seq $6, the last message finished, fenced by the
-- lease: $1 group, $2 topic, $3 partition, $4 me, $5 token. Clears the
-- attempts, backoff, last error and the delivery in flight; the next
-- message starts with the delivery it had without an outcome when it is a
-- suspect (0009_crash_evidence.sql), else none. Runs in the caller's
-- transaction. Returns the next message's unexplained deliveries.
UPDATE {{schema}}.cursors SET seq = $6, attempts = 0,
	unexplained = CASE WHEN $6 + 1 BETWEEN suspect_from AND suspect_to THEN 1 ELSE 0 END,
	deliveries = CASE WHEN $6 + 1 BETWEEN suspect_from AND suspect_to THEN 1 ELSE 0 END,
	suspect_from = CASE WHEN $6 >= suspect_to THEN 0 ELSE suspect_from END,
	suspect_to = CASE WHEN $6 >= suspect_to THEN 0 ELSE suspect_to END,
	inflight_from = 0, inflight_to = 0, inflight_solo = false,
	backoff_until = NULL, last_error = NULL, last_error_at = NULL, updated_at = clock_timestamp()
WHERE group_name = $1 AND topic = $2 AND partition = $3 AND lease_owner = $4 AND lease_token = $5
	AND lease_expires_at > clock_timestamp() AND seq < $6
RETURNING unexplained;

-- name: CursorsAdvanceRelaxed
-- CursorsAdvance in a transaction of its own that commits without waiting
-- for its WAL flush: set_config(..., true) lasts until the end of the
-- statement's implicit transaction, and the commit reads it.
UPDATE {{schema}}.cursors SET seq = $6, attempts = 0,
	unexplained = CASE WHEN $6 + 1 BETWEEN suspect_from AND suspect_to THEN 1 ELSE 0 END,
	deliveries = CASE WHEN $6 + 1 BETWEEN suspect_from AND suspect_to THEN 1 ELSE 0 END,
	suspect_from = CASE WHEN $6 >= suspect_to THEN 0 ELSE suspect_from END,
	suspect_to = CASE WHEN $6 >= suspect_to THEN 0 ELSE suspect_to END,
	inflight_from = 0, inflight_to = 0, inflight_solo = false,
	backoff_until = NULL, last_error = NULL, last_error_at = NULL, updated_at = clock_timestamp()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE group_name = $1 AND topic = $2 AND partition = $3 AND lease_owner = $4 AND lease_token = $5
	AND lease_expires_at > clock_timestamp() AND seq < $6
RETURNING unexplained;

-- name: CursorsAdvanceRelaxedMany
-- CursorsAdvanceRelaxed for several cursors at once: internal/pgcombine
-- merges the relaxed cursor moves that meet in one round trip into this
-- statement. One array element per move, in one order: $1 groups, $2
-- topics, $3 partitions, $4 me, $5 tokens, $6 seqs. No two moves of one
-- cursor. Returns, per cursor moved, the move's ordinal (1 for the first
-- element) and the next message's unexplained deliveries.
UPDATE {{schema}}.cursors c SET seq = r.to_seq, attempts = 0,
	unexplained = CASE WHEN r.to_seq + 1 BETWEEN c.suspect_from AND c.suspect_to THEN 1 ELSE 0 END,
	deliveries = CASE WHEN r.to_seq + 1 BETWEEN c.suspect_from AND c.suspect_to THEN 1 ELSE 0 END,
	suspect_from = CASE WHEN r.to_seq >= c.suspect_to THEN 0 ELSE c.suspect_from END,
	suspect_to = CASE WHEN r.to_seq >= c.suspect_to THEN 0 ELSE c.suspect_to END,
	inflight_from = 0, inflight_to = 0, inflight_solo = false,
	backoff_until = NULL, last_error = NULL, last_error_at = NULL, updated_at = clock_timestamp()
FROM unnest($1::text[], $2::text[], $3::int4[], $4::text[], $5::int8[], $6::int8[])
		WITH ORDINALITY AS r(grp, topic, part, me, token, to_seq, i),
	(SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE c.group_name = r.grp AND c.topic = r.topic AND c.partition = r.part AND c.lease_owner = r.me
	AND c.lease_token = r.token AND c.lease_expires_at > clock_timestamp() AND c.seq < r.to_seq
RETURNING r.i, c.unexplained;

-- name: CursorsRetry
-- Records a failed attempt of the head message and when its retry is due,
-- so that a restart or a lease move keeps the backoff; the delivery in
-- flight has its outcome. $1 group, $2 topic, $3 partition, $4 me, $5 token
-- (the fence), $6 error text, $7 retry delay in µs.
UPDATE {{schema}}.cursors SET attempts = least(attempts, 2147483646) + 1, last_error = $6,
	last_error_at = clock_timestamp(), updated_at = clock_timestamp(),
	backoff_until = clock_timestamp() + $7::int8 * interval '1 microsecond',
	inflight_from = 0, inflight_to = 0, inflight_solo = false
WHERE group_name = $1 AND topic = $2 AND partition = $3 AND lease_owner = $4 AND lease_token = $5
	AND lease_expires_at > clock_timestamp();

-- name: CursorsUndoDelivery
-- Takes back the delivery in flight, counted by LogReadCounting, whose
-- message was never handed out or which the worker's own stop interrupted
-- (no crash: nothing for the next holder to settle). $1..$5 as CursorsRetry
-- (the fence), $6 the cursor. Nothing in flight: nothing changes.
UPDATE {{schema}}.cursors SET deliveries = greatest(deliveries - 1, attempts + unexplained),
	inflight_from = 0, inflight_to = 0, inflight_solo = false
WHERE group_name = $1 AND topic = $2 AND partition = $3 AND lease_owner = $4 AND lease_token = $5
	AND lease_expires_at > clock_timestamp() AND seq = $6 AND inflight_to > seq;

-- name: CursorsMarkInFlight
-- Records messages after the heads of batches delivered one message at a
-- time as their partitions' deliveries in flight, before they are handed
-- out (never alone in their process: a delivery alone is a batch of one),
-- each fenced by its lease, committed without waiting for the WAL flush.
-- $1 group, then per record: $2 topic, $3 partition, $4 lease owner,
-- $5 lease token, $6 seq. Returns the topic and partition of each record
-- written; a missing one: the lease is gone.
UPDATE {{schema}}.cursors c SET inflight_from = x.seq, inflight_to = x.seq, inflight_solo = false
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed,
	unnest($2::text[], $3::int4[], $4::text[], $5::int8[], $6::int8[]) AS x(topic, partition, owner, token, seq)
WHERE c.group_name = $1 AND c.topic = x.topic AND c.partition = x.partition
	AND c.lease_owner = x.owner AND c.lease_token = x.token
	AND c.lease_expires_at > clock_timestamp() AND c.seq < x.seq
RETURNING c.topic, c.partition;

-- name: CursorsInspect
-- One cursor and its lease: $1 group, $2 topic, $3 partition.
SELECT seq, coalesce(lease_owner, ''), lease_token, coalesce(lease_expires_at > clock_timestamp(), false)
FROM {{schema}}.cursors WHERE group_name = $1 AND topic = $2 AND partition = $3;

-- name: CursorsSaveAdaptive
-- Saves a partition's adaptive batching state for the next lease holder.
-- $1 group, $2 topic, $3 partition, $4 token, $5 state, $6 batch size.
UPDATE {{schema}}.cursors SET adaptive_state = $5, batch_size = $6
WHERE group_name = $1 AND topic = $2 AND partition = $3 AND lease_token = $4;

-- name: CursorsHorizon
-- Retention: the horizon of each partition of a registered topic that has
-- cursors (the lowest finished seq over every group: held messages count
-- as unfinished), and the database clock,
-- which KeepFor is measured by.
SELECT c.topic, c.partition, min({{schema}}.finished_seq(c.group_name, c.topic, c.partition, c.seq)), now()
FROM {{schema}}.cursors c JOIN {{schema}}.topics t ON t.name = c.topic AND c.partition < t.partitions
GROUP BY c.topic, c.partition;

-- name: CursorsRetentionHolders
-- Retention: per topic and group, the partitions where the group's cursor is
-- the lowest (of the registered partitions, as for the horizon) and
-- messages are left after it, how many, the oldest of them, its last cursor
-- change there, its live members (heard from within their TTL), and the
-- newest heartbeat and the longest TTL of its members, live or not (NULL
-- without any), which tell one still joining from one gone; the biggest
-- holder of each topic first.
WITH f AS (
	SELECT c.group_name, c.topic, c.partition, c.updated_at, {{schema}}.finished_seq(c.group_name, c.topic, c.partition, c.seq) AS seq
	FROM {{schema}}.cursors c JOIN {{schema}}.topics t ON t.name = c.topic AND c.partition < t.partitions
), low AS (
	SELECT topic, partition, min(seq) AS seq FROM f GROUP BY topic, partition
), h AS (
	SELECT c.topic, c.group_name, array_agg(c.partition ORDER BY c.partition) AS parts,
		sum(p.last_seq - c.seq)::int8 AS messages, min(u.sequenced_at) AS oldest, max(c.updated_at) AS last_activity
	FROM low
	JOIN f c ON c.topic = low.topic AND c.partition = low.partition AND c.seq = low.seq
	JOIN {{schema}}.partitions p ON p.topic = c.topic AND p.partition = c.partition
	CROSS JOIN LATERAL (
		SELECT l.sequenced_at FROM {{schema}}.log l
		WHERE l.topic = c.topic AND l.partition = c.partition AND l.seq > c.seq ORDER BY l.seq LIMIT 1
	) u
	WHERE p.last_seq > c.seq
	GROUP BY c.topic, c.group_name
)
SELECT h.topic, h.group_name, h.parts, h.messages, h.oldest, h.last_activity,
	(SELECT count(*) FROM {{schema}}.members m WHERE m.group_name = h.group_name AND m.topic = h.topic
		AND m.heartbeat_at + m.ttl > now())::int4,
	m.heartbeat_at, m.ttl
FROM h
LEFT JOIN LATERAL (
	SELECT max(m.heartbeat_at) AS heartbeat_at, max(m.ttl) AS ttl FROM {{schema}}.members m
	WHERE m.group_name = h.group_name AND m.topic = h.topic
) m ON true
ORDER BY h.topic, h.messages DESC, h.group_name;

-- name: CursorsPause
-- Admin: pauses ($4 true) or resumes ($4 false) a consumer group's
-- partitions: $1 group, $2 topic ('' for all), $3 partitions (empty for
-- all). Resuming also ends a retry backoff: an operator who resumes wants
-- the partition to go on now ("retry now"). The rows are locked in key
-- order first, as every admin operation does.
UPDATE {{schema}}.cursors c SET paused = $4, updated_at = clock_timestamp(),
	backoff_until = CASE WHEN $4 THEN c.backoff_until END
FROM (
	SELECT topic, partition FROM {{schema}}.cursors
	WHERE group_name = $1 AND ($2 = '' OR topic = $2) AND (cardinality($3::int4[]) = 0 OR partition = ANY($3::int4[]))
	ORDER BY topic, partition
	FOR UPDATE) x
WHERE c.group_name = $1 AND c.topic = x.topic AND c.partition = x.partition;

-- name: CursorsLockForResetToSeq
-- Admin, before a reset: locks the scope's cursors ($1 group, $2 topic,
-- $3 partitions or empty for all) in key order and returns each partition,
-- its cursor (the finished seq: held messages are not finished), its head
-- (last_seq) and the target $4.
SELECT c.partition, {{schema}}.finished_seq($1, c.topic, c.partition, c.seq), coalesce(p.last_seq, 0), $4::int8
FROM (
	SELECT topic, partition, seq FROM {{schema}}.cursors
	WHERE group_name = $1 AND ($2 = '' OR topic = $2) AND (cardinality($3::int4[]) = 0 OR partition = ANY($3::int4[]))
	ORDER BY topic, partition
	FOR UPDATE) c
LEFT JOIN {{schema}}.partitions p ON p.topic = c.topic AND p.partition = c.partition
ORDER BY c.partition;

-- name: CursorsLockForResetToTime
-- CursorsLockForResetToSeq with a time $4 as target: the seq before the
-- first message sequenced at or after it, or the head when none is.
SELECT c.partition, {{schema}}.finished_seq($1, c.topic, c.partition, c.seq), coalesce(p.last_seq, 0),
	coalesce((SELECT min(l.seq) - 1 FROM {{schema}}.log l
		WHERE l.topic = c.topic AND l.partition = c.partition AND l.sequenced_at >= $4::timestamptz), coalesce(p.last_seq, 0))
FROM (
	SELECT topic, partition, seq FROM {{schema}}.cursors
	WHERE group_name = $1 AND ($2 = '' OR topic = $2) AND (cardinality($3::int4[]) = 0 OR partition = ANY($3::int4[]))
	ORDER BY topic, partition
	FOR UPDATE) c
LEFT JOIN {{schema}}.partitions p ON p.topic = c.topic AND p.partition = c.partition
ORDER BY c.partition;

-- name: CursorsReset
-- Admin: moves cursors ($1 group, $2 topic, $3 partitions, $4 their new
-- seqs) and revokes their leases (no owner, token + 1), so that the worker
-- holding one stops at its next renewal or cursor write. Clears the head's
-- attempts, deliveries, backoff and last error; the caller forgets their
-- held messages (HeldClear) in the same transaction.
UPDATE {{schema}}.cursors c
SET seq = x.seq, lease_owner = NULL, lease_token = c.lease_token + 1, lease_expires_at = NULL,
	attempts = 0, deliveries = 0, backoff_until = NULL, last_error = NULL, last_error_at = NULL, updated_at = clock_timestamp(),
	isolation_full = NULL, inflight_from = 0, inflight_to = 0, inflight_solo = false, suspect_from = 0, suspect_to = 0,
	unexplained = 0
FROM unnest($3::int4[], $4::int8[]) AS x(partition, seq)
WHERE c.group_name = $1 AND c.topic = $2 AND c.partition = x.partition;

-- name: CursorsLockGroup
-- Admin, before deleting a group: locks its cursors ($1 group, $2 topic or
-- '' for all) in key order, so that no lease on them can be acquired,
-- renewed or written until the decision commits.
SELECT 1 FROM {{schema}}.cursors
WHERE group_name = $1 AND ($2 = '' OR topic = $2) ORDER BY topic, partition FOR UPDATE;

-- name: CursorsGroupInUse
-- Admin: the live members of group $1 (topic $2 or '' for all; heard from
-- within their TTL, or holding an unexpired lease) and how many partitions
-- have an unexpired lease, by the server's clock at the time of the
-- statement.
SELECT
	ARRAY(SELECT member_id FROM {{schema}}.members
			WHERE group_name = $1 AND ($2 = '' OR topic = $2) AND heartbeat_at + ttl > clock_timestamp()
		UNION
		SELECT lease_owner FROM {{schema}}.cursors
			WHERE group_name = $1 AND ($2 = '' OR topic = $2) AND lease_owner IS NOT NULL AND lease_expires_at > clock_timestamp()
		ORDER BY 1),
	(SELECT count(*) FROM {{schema}}.cursors
		WHERE group_name = $1 AND ($2 = '' OR topic = $2) AND lease_owner IS NOT NULL AND lease_expires_at > clock_timestamp())::int4;

-- name: CursorsDeleteGroup
-- Admin: deletes group $1's cursors (topic $2 or '' for all).
DELETE FROM {{schema}}.cursors WHERE group_name = $1 AND ($2 = '' OR topic = $2);

-- name: CursorsStatus
-- Admin status: every cursor of group $1 and topic $2 ('' for all), with its
-- partition's head, the oldest unconsumed message's time, the oldest seq
-- the log still holds, the lease, pause, adaptive state, the head's
-- attempts, deliveries, backoff and last error, and the partition's pending
-- dead letters; then the scan position and since when the partition blocks
-- because its isolation bounds are reached (key-level isolation), whether a
-- delivery is in flight and how many suspects are left
-- (0009_crash_evidence.sql). The cursor shown is the finished seq (held
-- messages are not finished).
SELECT c.group_name, c.topic, c.partition, coalesce(p.last_seq, 0), f.seq,
	u.sequenced_at,
	coalesce((SELECT l.seq FROM {{schema}}.log l WHERE l.topic = c.topic AND l.partition = c.partition ORDER BY l.seq LIMIT 1), 0),
	coalesce(c.lease_owner, ''), c.lease_expires_at, c.lease_owner IS NOT NULL AND coalesce(c.lease_expires_at > now(), false),
	c.lease_token, c.paused, c.adaptive_state, coalesce(c.batch_size, 0), c.attempts, coalesce(c.last_error, ''),
	c.last_error_at, c.updated_at, c.deliveries, c.backoff_until,
	(SELECT count(*) FROM {{schema}}.dead_letters d WHERE d.group_name = c.group_name AND d.topic = c.topic
		AND d.partition = c.partition AND d.status = 'pending'),
	c.seq, c.isolation_full, c.inflight_to > c.seq,
	greatest(c.suspect_to - greatest(c.suspect_from - 1, c.seq), 0)
FROM {{schema}}.cursors c
CROSS JOIN LATERAL (SELECT {{schema}}.finished_seq(c.group_name, c.topic, c.partition, c.seq) AS seq) f
LEFT JOIN {{schema}}.partitions p ON p.topic = c.topic AND p.partition = c.partition
LEFT JOIN LATERAL (
	SELECT l.sequenced_at FROM {{schema}}.log l
	WHERE l.topic = c.topic AND l.partition = c.partition AND l.seq > f.seq ORDER BY l.seq LIMIT 1
) u ON true
WHERE ($1 = '' OR c.group_name = $1) AND ($2 = '' OR c.topic = $2)
ORDER BY c.topic, c.group_name, c.partition;

-- name: CursorsStatusHolders
-- Admin status: per topic ($1, '' for all) and group, the partitions where
-- the group's cursor is the lowest and messages are left after it, the
-- biggest holder of each topic first.
WITH f AS (
	SELECT c.group_name, c.topic, c.partition, {{schema}}.finished_seq(c.group_name, c.topic, c.partition, c.seq) AS seq
	FROM {{schema}}.cursors c WHERE $1 = '' OR c.topic = $1
), low AS (
	SELECT topic, partition, min(seq) AS seq FROM f GROUP BY topic, partition
)
SELECT c.topic, c.group_name, array_agg(c.partition ORDER BY c.partition)
FROM low
JOIN f c ON c.topic = low.topic AND c.partition = low.partition AND c.seq = low.seq
JOIN {{schema}}.partitions p ON p.topic = c.topic AND p.partition = c.partition
WHERE p.last_seq > c.seq
	AND EXISTS (SELECT 1 FROM {{schema}}.log l WHERE l.topic = c.topic AND l.partition = c.partition AND l.seq > c.seq)
GROUP BY c.topic, c.group_name
ORDER BY c.topic, sum(p.last_seq - c.seq) DESC, c.group_name;

-- name: CursorsMetrics
-- Metrics: per consumer group and topic (registered partitions only), the
-- messages behind the cursors, the age in seconds of the oldest of them (0
-- when none), the partitions degraded, backing off and paused, the
-- unexpired leases and the live members (heard from within their TTL); then
-- (key-level isolation) the partitions blocking because their bounds are
-- reached, the held messages and the held keys. Behind means after the
-- finished seq: held messages count. One
-- index lookup per partition for the oldest message's time.
WITH c AS (
	SELECT c.group_name, c.topic, c.partition, {{schema}}.finished_seq(c.group_name, c.topic, c.partition, c.seq) AS seq, c.adaptive_state, c.backoff_until, c.paused,
		c.lease_expires_at, c.isolation_full, coalesce(p.last_seq, 0) AS head
	FROM {{schema}}.cursors c
	JOIN {{schema}}.topics t ON t.name = c.topic AND c.partition < t.partitions
	LEFT JOIN {{schema}}.partitions p ON p.topic = c.topic AND p.partition = c.partition
)
SELECT c.group_name, c.topic,
	sum(greatest(c.head - c.seq, 0))::int8,
	coalesce(max(extract(epoch FROM now() - u.sequenced_at)), 0)::float8,
	count(*) FILTER (WHERE c.adaptive_state <> 'normal')::int4,
	count(*) FILTER (WHERE c.backoff_until > now())::int4,
	count(*) FILTER (WHERE c.paused)::int4,
	count(*) FILTER (WHERE c.lease_expires_at > now())::int4,
	(SELECT count(*) FROM {{schema}}.members m WHERE m.group_name = c.group_name AND m.topic = c.topic
		AND m.heartbeat_at + m.ttl > now())::int4,
	count(*) FILTER (WHERE c.isolation_full IS NOT NULL)::int4,
	(SELECT count(*) FROM {{schema}}.held h WHERE h.group_name = c.group_name AND h.topic = c.topic)::int8,
	(SELECT count(DISTINCT (h.partition, coalesce(h.partition_key, h.seq::text), h.partition_key IS NULL)) FROM {{schema}}.held h
		WHERE h.group_name = c.group_name AND h.topic = c.topic)::int8
FROM c
LEFT JOIN LATERAL (
	SELECT l.sequenced_at FROM {{schema}}.log l
	WHERE c.head > c.seq AND l.topic = c.topic AND l.partition = c.partition AND l.seq > c.seq ORDER BY l.seq LIMIT 1
) u ON true
GROUP BY c.group_name, c.topic
ORDER BY c.group_name, c.topic;

-- name: CursorsTickState
-- Why a synchronous runner (outboxtest) holds no lease: of group $1's
-- partitions of topic $2, how many are paused, and how many are leased by
-- a member other than $3.
SELECT count(*) FILTER (WHERE paused)::int4,
	count(*) FILTER (WHERE NOT paused AND lease_owner IS NOT NULL AND lease_owner <> $3 AND lease_expires_at > clock_timestamp())::int4
FROM {{schema}}.cursors WHERE group_name = $1 AND topic = $2;
