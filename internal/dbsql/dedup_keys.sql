-- dedup_keys: the dedup keys of messages published with outbox.DedupKey,
-- one row per (topic, key) claimed and not yet deleted by retention
-- (0013_dedup.sql).
--
-- A publish claims its keys in the same statement that writes its
-- messages, in the caller's transaction: INSERT ... ON CONFLICT DO UPDATE
-- ... WHERE the row expired. A key is claimed (returned) when no row
-- exists or the row's window is over; otherwise the conflicting row is
-- locked, not changed, and the message of that key is not written.
-- Concurrent transactions on one key, in READ COMMITTED: the second one's
-- insert waits for the first one to end (on the uncommitted row, or on the
-- row lock of an update); if the first committed, the second finds the
-- row, now committed and unexpired, and skips; if it rolled back, the
-- second claims the key. In REPEATABLE READ or SERIALIZABLE the second
-- fails with SQLSTATE 40001 instead (the row is not in its snapshot).
-- Keys are claimed in key order, so that two publishes with overlapping
-- keys lock them in the same order and cannot deadlock each other. The
-- caller removes repeated keys of one call first (the first message of a
-- key wins): one statement cannot claim a row twice.
--
-- Both publish statements return the 1-based positions, in the arrays
-- given, of the messages not written, as text ('' for none, '3,7' for two),
-- readable by every driver.

-- name: DedupKeysInsertPending
-- The table mode's publish of a call with dedup keys: PendingInsert's
-- arrays $1..$6, $7 the dedup keys ('' for a message without one, always
-- written), $8 the window in µs (expires_at = the statement's time plus
-- it), $9 the channel to notify when the transaction commits (NULL: none).
-- Returns the positions skipped and the notifications sent (0 or 1). A
-- delayed message gets deliver_at and holds as in PendingInsert.
WITH src AS MATERIALIZED (
	SELECT x.* FROM unnest($2::int4[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[]) WITH ORDINALITY AS x(p, k, u, m, b, d, ord)
), claimed AS (
	INSERT INTO {{schema}}.dedup_keys AS dk (topic, dedup_key, expires_at)
	SELECT $1, s.d, statement_timestamp() + $8::int8 * interval '1 microsecond' FROM src s WHERE s.d <> '' ORDER BY s.d
	ON CONFLICT (topic, dedup_key) DO UPDATE SET expires_at = excluded.expires_at
	WHERE dk.expires_at <= statement_timestamp()
	RETURNING dk.dedup_key
), kept AS MATERIALIZED (
	SELECT s.*, CASE WHEN octet_length(s.b) >= 1024 THEN nextval('{{schema}}.bodies_id_seq') END AS body_id
	FROM src s WHERE s.d = '' OR s.d IN (SELECT c.dedup_key FROM claimed c)
), bodies AS (
	INSERT INTO {{schema}}.bodies (id, payload) SELECT body_id, b FROM kept WHERE body_id IS NOT NULL
), ins AS (
	INSERT INTO {{schema}}.pending (topic, partition, partition_key, uuid, metadata, payload, body_id, deliver_at, holds)
	SELECT $1, p, NULLIF(k, ''), u, mj, CASE WHEN body_id IS NULL THEN b END, body_id,
		(mj ->> 'outbox_deliver_at')::timestamptz, mj ? 'outbox_deliver_at' AND k <> '' AND NOT mj ? 'outbox_unordered'
	FROM (SELECT kept.*, kept.m::jsonb AS mj FROM kept) x ORDER BY ord
)
SELECT coalesce((SELECT string_agg(s.ord::text, ',' ORDER BY s.ord) FROM src s WHERE s.ord NOT IN (SELECT k.ord FROM kept k)), ''),
	(SELECT count(pg_notify($9::text, '')) WHERE $9::text IS NOT NULL);

-- name: DedupKeysEmit
-- The log-based mode's publish of a call with dedup keys: $1 slot, $2
-- prefix and $3 records as in WALEmit, $4 topic, $5 the records' dedup
-- keys ('' for none), $6 the window in µs. Only the records whose key was
-- claimed (or that have none) are written, through wal_emit, with its
-- checks; when none is left nothing is written and nothing checked.
-- Returns the positions skipped and the records written.
WITH src AS MATERIALIZED (
	SELECT x.* FROM unnest($3::bytea[], $5::text[]) WITH ORDINALITY AS x(r, d, ord)
), claimed AS (
	INSERT INTO {{schema}}.dedup_keys AS dk (topic, dedup_key, expires_at)
	SELECT $4, s.d, statement_timestamp() + $6::int8 * interval '1 microsecond' FROM src s WHERE s.d <> '' ORDER BY s.d
	ON CONFLICT (topic, dedup_key) DO UPDATE SET expires_at = excluded.expires_at
	WHERE dk.expires_at <= statement_timestamp()
	RETURNING dk.dedup_key
), kept AS MATERIALIZED (
	SELECT s.r, s.ord FROM src s WHERE s.d = '' OR s.d IN (SELECT c.dedup_key FROM claimed c)
)
SELECT coalesce((SELECT string_agg(s.ord::text, ',' ORDER BY s.ord) FROM src s WHERE s.ord NOT IN (SELECT k.ord FROM kept k)), ''),
	CASE WHEN EXISTS (SELECT 1 FROM kept) THEN {{schema}}.wal_emit($1, $2, ARRAY(SELECT k.r FROM kept k ORDER BY k.ord)) ELSE 0 END;

-- name: DedupKeysPurgeExpired
-- Retention: deletes up to $1 rows whose window is over (expires_at
-- passed, by the server's clock), oldest first, through the index on
-- expires_at. A row a publish is claiming again (locked) is skipped, and
-- one claimed again since it was picked keeps its new window (the
-- condition is checked again on the row deleted). Returns how many.
WITH d AS (
	DELETE FROM {{schema}}.dedup_keys k
	USING (
		SELECT e.topic, e.dedup_key FROM {{schema}}.dedup_keys e
		WHERE e.expires_at <= now() ORDER BY e.expires_at LIMIT $1
		FOR UPDATE SKIP LOCKED
	) x
	WHERE k.topic = x.topic AND k.dedup_key = x.dedup_key AND k.expires_at <= now()
	RETURNING 1
)
SELECT count(*) FROM d;

-- name: DedupKeysStatus
-- Admin status: per topic ($1 a topic, '' for all) with unexpired dedup
-- keys, how many, counted up to $2 (a count of $2 means at least that
-- many): a bounded index scan per topic, however large the table.
SELECT t.name, n.n
FROM {{schema}}.topics t
CROSS JOIN LATERAL (
	SELECT count(*) AS n FROM (
		SELECT 1 FROM {{schema}}.dedup_keys d WHERE d.topic = t.name AND d.expires_at > now() LIMIT $2
	) l
) n
WHERE ($1 = '' OR t.name = $1) AND n.n > 0
ORDER BY t.name;
