-- held: the messages a consumer group holds back by key (key-level
-- isolation, see migrations/0006_key_isolation.sql). The worker holding the
-- partition's lease writes them, each write fenced by that lease on the
-- cursor row; the admin reads them and requests actions.
--
-- Parameters shared by the worker's statements: $1 group, $2 topic,
-- $3 partition, $4 lease owner, $5 lease token.

-- name: HeldLoad
-- The partition's held messages in seq order, for the lease holder: a
-- new holder first settles the retries left in flight (HeldAdopt). The
-- last column says whether the message is a suspect (a retry ended without
-- an outcome while others were in flight): it is retried alone.
SELECT seq, partition_key IS NULL, coalesce(partition_key, ''), attempts, deliveries, coalesce(last_error, ''),
	first_failure_at, retry_at, coalesce(requested, ''), unexplained > 0
FROM {{schema}}.held
WHERE group_name = $1 AND topic = $2 AND partition = $3
ORDER BY seq;

-- name: HeldAdopt
-- A new lease holder settles the held retries the last holder left in
-- flight (it died or froze mid-retry), as CursorsAcquire does for the
-- cursor row (0009_crash_evidence.sql): a retry that was the only delivery
-- in flight in its process is charged as a failed attempt, with the
-- message's unexplained deliveries; any other is kept as unexplained, and
-- the message is retried alone.
UPDATE {{schema}}.held h SET
	attempts = CASE WHEN h.inflight_solo THEN least(h.attempts + 1 + h.unexplained, 2147483646) ELSE h.attempts END,
	unexplained = CASE WHEN h.inflight_solo THEN 0 ELSE h.unexplained + 1 END,
	inflight = false, inflight_solo = false,
	last_error = CASE WHEN h.inflight_solo
		THEN format('seq %s: the consumer process died while this retry was the only delivery in flight in it', h.seq)
		ELSE coalesce(h.last_error, format('seq %s: the consumer process died with other deliveries in flight: nobody is charged; the message is retried alone', h.seq)) END,
	last_error_at = clock_timestamp(), first_failure_at = coalesce(h.first_failure_at, clock_timestamp())
FROM {{schema}}.cursors c
WHERE h.group_name = $1 AND h.topic = $2 AND h.partition = $3 AND h.inflight
	AND c.group_name = $1 AND c.topic = $2 AND c.partition = $3
	AND c.lease_owner = $4 AND c.lease_token = $5 AND c.lease_expires_at > clock_timestamp();

-- name: HeldInsert
-- Holds messages back, in the transaction that moves the scan position
-- past them (that move is fenced, so a lost lease rolls this back too).
-- $4 seqs, $5 keys (NULL: keyless), $6 the failed attempts of each, $7 the
-- last error of each (NULL for a message only waiting behind its key's
-- head), $8 the delay of each one's retry in µs. A message already held
-- stays as it is.
INSERT INTO {{schema}}.held (group_name, topic, partition, seq, partition_key, attempts, deliveries,
	last_error, first_failure_at, last_error_at, retry_at)
SELECT $1, $2, $3, x.seq, x.key, x.attempts, x.attempts, x.err,
	CASE WHEN x.err IS NULL THEN NULL ELSE clock_timestamp() END,
	CASE WHEN x.err IS NULL THEN NULL ELSE clock_timestamp() END,
	CASE WHEN x.err IS NULL THEN NULL ELSE clock_timestamp() + x.delay * interval '1 microsecond' END
FROM unnest($4::int8[], $5::text[], $6::int4[], $7::text[], $8::int8[]) AS x(seq, key, attempts, err, delay)
ON CONFLICT (group_name, topic, partition, seq) DO NOTHING;

-- name: HeldCount
-- Counts a retry of held message $6 before it is handed out, and records it
-- as in flight ($7: the only delivery in flight in its process), fenced by
-- the lease; returns the deliveries so far (this one included). No row: the
-- lease is gone, or the message is no longer held.
UPDATE {{schema}}.held h SET deliveries = greatest(h.deliveries, h.attempts + h.unexplained) + 1,
	inflight = true, inflight_solo = $7
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed, {{schema}}.cursors c
WHERE h.group_name = $1 AND h.topic = $2 AND h.partition = $3 AND h.seq = $6
	AND c.group_name = $1 AND c.topic = $2 AND c.partition = $3
	AND c.lease_owner = $4 AND c.lease_token = $5 AND c.lease_expires_at > clock_timestamp()
RETURNING h.deliveries;

-- name: HeldUndoCount
-- Takes back a retry counted by HeldCount that was never handed out.
UPDATE {{schema}}.held h SET deliveries = greatest(h.deliveries - 1, h.attempts + h.unexplained),
	inflight = false, inflight_solo = false
FROM {{schema}}.cursors c
WHERE h.group_name = $1 AND h.topic = $2 AND h.partition = $3 AND h.seq = $6
	AND c.group_name = $1 AND c.topic = $2 AND c.partition = $3
	AND c.lease_owner = $4 AND c.lease_token = $5 AND c.lease_expires_at > clock_timestamp();

-- name: HeldRetry
-- Records a failed retry of held message $6: $7 the error, $8 the delay
-- of the next retry in µs.
UPDATE {{schema}}.held h SET attempts = least(h.attempts + 1, 2147483647),
	deliveries = least(greatest(h.attempts + 1 + h.unexplained, h.deliveries), 2147483647),
	inflight = false, inflight_solo = false,
	last_error = $7, last_error_at = clock_timestamp(), first_failure_at = coalesce(h.first_failure_at, clock_timestamp()),
	retry_at = clock_timestamp() + $8::int8 * interval '1 microsecond'
FROM {{schema}}.cursors c
WHERE h.group_name = $1 AND h.topic = $2 AND h.partition = $3 AND h.seq = $6
	AND c.group_name = $1 AND c.topic = $2 AND c.partition = $3
	AND c.lease_owner = $4 AND c.lease_token = $5 AND c.lease_expires_at > clock_timestamp();

-- name: HeldRelease
-- Finishes held messages $6 (seqs: acked, or taken out as dead letters),
-- fenced by the lease, in the caller's transaction when it has one.
-- Returns the seqs released.
DELETE FROM {{schema}}.held h
USING {{schema}}.cursors c
WHERE h.group_name = $1 AND h.topic = $2 AND h.partition = $3 AND h.seq = ANY($6::int8[])
	AND c.group_name = $1 AND c.topic = $2 AND c.partition = $3
	AND c.lease_owner = $4 AND c.lease_token = $5 AND c.lease_expires_at > clock_timestamp()
RETURNING h.seq;

-- name: HeldShowFull
-- Shows ($6 true) or clears that the partition blocks because its bounds
-- on held keys and messages are reached.
UPDATE {{schema}}.cursors SET isolation_full = CASE WHEN $6::boolean THEN coalesce(isolation_full, clock_timestamp()) END
WHERE group_name = $1 AND topic = $2 AND partition = $3 AND lease_owner = $4 AND lease_token = $5;

-- name: HeldStatus
-- Admin status: the held keys of group $1 ('' for all) and topic $2 ('' for
-- all), one row per key (a keyless message is one of its own): the head's
-- seq, attempts, last error, first failure and next retry, how many
-- messages the key holds, since when, and a pending request.
WITH h AS (
	SELECT h.*, count(*) OVER (PARTITION BY h.group_name, h.topic, h.partition, h.partition_key,
		CASE WHEN h.partition_key IS NULL THEN h.seq END) AS messages
	FROM {{schema}}.held h
	WHERE ($1 = '' OR h.group_name = $1) AND ($2 = '' OR h.topic = $2)
)
SELECT DISTINCT ON (group_name, topic, partition, partition_key, CASE WHEN partition_key IS NULL THEN seq END)
	group_name, topic, partition, partition_key IS NULL, coalesce(partition_key, ''), seq, messages,
	greatest(attempts, deliveries), coalesce(last_error, ''), first_failure_at, retry_at, held_at, coalesce(requested, '')
FROM h
ORDER BY group_name, topic, partition, partition_key, CASE WHEN partition_key IS NULL THEN seq END, seq;

-- name: HeldHeads
-- Admin: the head message of each held key of group $1 ('' for all) and
-- topic $2 ('' for all), in the order of HeldStatus: group, topic,
-- partition, seq, uuid ('' when the log no longer holds it), payload (from
-- bodies when it is kept there), and whether the message or its payload is
-- gone.
SELECT DISTINCT ON (h.group_name, h.topic, h.partition, h.partition_key, CASE WHEN h.partition_key IS NULL THEN h.seq END)
	h.group_name, h.topic, h.partition, h.seq, coalesce(l.uuid, ''),
	coalesce(l.payload, (SELECT b.payload FROM {{schema}}.bodies b WHERE b.id = l.body_id)),
	l.seq IS NULL OR (l.payload IS NULL AND NOT EXISTS (SELECT FROM {{schema}}.bodies b WHERE b.id = l.body_id))
FROM {{schema}}.held h
LEFT JOIN {{schema}}.log l ON l.topic = h.topic AND l.partition = h.partition AND l.seq = h.seq
WHERE ($1 = '' OR h.group_name = $1) AND ($2 = '' OR h.topic = $2)
ORDER BY h.group_name, h.topic, h.partition, h.partition_key, CASE WHEN h.partition_key IS NULL THEN h.seq END, h.seq;

-- name: HeldRetryNow
-- Admin: retries held key $4 of ($1 group, $2 topic, $3 partition) at once
-- with a fresh count of attempts (a keyless message: $4 NULL and $5 its
-- seq). Returns the key's held seqs.
UPDATE {{schema}}.held SET
	attempts = CASE WHEN seq = (SELECT min(seq) FROM {{schema}}.held WHERE group_name = $1 AND topic = $2 AND partition = $3
		AND (partition_key = $4 OR ($4 IS NULL AND partition_key IS NULL AND seq = $5))) THEN 0 ELSE attempts END,
	deliveries = 0, retry_at = NULL
WHERE group_name = $1 AND topic = $2 AND partition = $3
	AND (partition_key = $4 OR ($4 IS NULL AND partition_key IS NULL AND seq = $5))
RETURNING seq;

-- name: HeldRequestDeadLetter
-- Admin: asks the lease holder to take held key $4 (or keyless message $5)
-- of ($1 group, $2 topic, $3 partition) out as dead letters, every held
-- message of it. Returns the key's held seqs.
UPDATE {{schema}}.held SET requested = 'dead_letter'
WHERE group_name = $1 AND topic = $2 AND partition = $3
	AND (partition_key = $4 OR ($4 IS NULL AND partition_key IS NULL AND seq = $5))
RETURNING seq;

-- name: HeldClear
-- Admin reset: forgets the held messages of group $1, topic $2, partitions
-- $3 (the cursor moves; what is after it is delivered again).
DELETE FROM {{schema}}.held WHERE group_name = $1 AND topic = $2 AND partition = ANY($3::int4[]);
