-- The log-based mode: publishing into the WAL, the relay's slot and its
-- appends to the log. {{wal}} is the quoted name of the schema's
-- publication (and, as a bind parameter, of its slot): the schema name
-- followed by _wal.

-- name: WALEmit
-- Many messages: $1 prefix, $2 records (internal/walrecord), written in
-- array order, each only if the transaction commits.
SELECT count(pg_logical_emit_message(true, $1, x.r))
FROM (SELECT u.r FROM unnest($2::bytea[]) WITH ORDINALITY AS u(r, ord) ORDER BY u.ord) x;

-- name: WALEmitOne
-- One message: $1 prefix, $2 record.
SELECT pg_logical_emit_message(true, $1, $2::bytea);

-- name: WALPrerequisites
-- What the log-based mode needs of the server and the role: wal_level,
-- whether the role may use replication slots, max_replication_slots.
SELECT current_setting('wal_level'),
	coalesce((SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user), false),
	current_setting('max_replication_slots')::int4;

-- name: WALPublicationExists
SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1);

-- name: WALPublicationCreate
-- A publication of no tables: pgoutput needs one, and with no tables it
-- sends only the messages (and skips every other transaction).
CREATE PUBLICATION {{wal}};

-- name: WALPublicationDrop
DROP PUBLICATION IF EXISTS {{wal}};

-- name: WALSlotExists
SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1);

-- name: WALSlotCreate
SELECT pg_create_logical_replication_slot($1, 'pgoutput');

-- name: WALSlotDrop
SELECT pg_drop_replication_slot($1);

-- name: WALRelayInit
INSERT INTO {{schema}}.relays (slot) VALUES ($1) ON CONFLICT (slot) DO NOTHING;

-- name: WALRelayDelete
DELETE FROM {{schema}}.relays WHERE slot = $1;

-- name: WALRelayPosition
-- The commit LSN of the last transaction appended (0: none).
SELECT lsn FROM {{schema}}.relays WHERE slot = $1;

-- name: WALSlotStatus
-- $1 slot: whether a relay streams it, the WAL it keeps (bytes from its
-- restart position to the server's current insert position), its confirmed position,
-- the server's wal_status for it (reserved, extended, unreserved, lost),
-- and the relay's own position (relays.lsn).
SELECT s.active,
	coalesce(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), s.restart_lsn), 0)::int8,
	coalesce(pg_wal_lsn_diff(s.confirmed_flush_lsn, '0/0'), 0)::int8,
	coalesce(s.wal_status, ''),
	coalesce((SELECT r.lsn FROM {{schema}}.relays r WHERE r.slot = $1), 0)
FROM pg_replication_slots s WHERE s.slot_name = $1;

-- name: WALAdvance
-- The relay's first statement when it appends the messages of whole
-- transactions: relays.lsn of slot $1 moves from $2 to $3 (when it is not
-- at $2, another relay appended since, and nothing else happens), and each
-- partition ($4 topics, $5 partitions) takes the next $6 seqs (the
-- partitions row is the Sequencer's, so table-mode messages of the same
-- partition interleave gap-free). Returns whether relays moved, and each
-- partition's base (its seqs are base+1..base+n); a partition that is not
-- registered is missing from the result (the caller rolls back). Unless $7
-- is NULL, the subscribers are woken on that channel when the transaction
-- commits, as the sequencer wakes them. The rows themselves follow with
-- COPY into bodies (payloads of 1 KiB or more, ids from BodiesNextIDs) and
-- log, the COPY statements built by pgx from the quoted table and column
-- names (relay/relay.go), in the same transaction.
WITH relay AS (
	UPDATE {{schema}}.relays SET lsn = $3, updated_at = now() WHERE slot = $1 AND lsn = $2 RETURNING 1
), counts AS (
	SELECT c.t, c.p, c.n FROM unnest($4::text[], $5::int4[], $6::int8[]) AS c(t, p, n) WHERE EXISTS (SELECT 1 FROM relay)
), advanced AS (
	UPDATE {{schema}}.partitions pt SET last_seq = pt.last_seq + c.n, sequenced_at = now()
	FROM counts c WHERE pt.topic = c.t AND pt.partition = c.p
	RETURNING pt.topic, pt.partition, pt.last_seq - c.n AS base
)
SELECT (SELECT count(*) FROM relay)::int8,
	coalesce((SELECT array_agg(a.topic) FROM advanced a), '{}'),
	coalesce((SELECT array_agg(a.partition) FROM advanced a), '{}'),
	coalesce((SELECT array_agg(a.base) FROM advanced a), '{}'),
	CASE WHEN $7::text IS NOT NULL THEN
		(SELECT count(pg_notify($7, n.t || ':' || n.ps)) FROM (SELECT t, string_agg(p::text, ',') AS ps FROM counts GROUP BY t) n)
	END::int8;

-- name: WALAppendSmall
-- A whole append of a few messages without large payloads, in one
-- statement (autocommit, one round trip): relays.lsn of slot $1 moves from
-- $2 to $3 (when it is not at $2, another relay appended since, and nothing
-- happens), each partition takes the next seqs, and the messages ($4
-- topics, $5 partitions, $6 keys (NULL: none), $7 uuids, $8 metadata as
-- JSON text, $9 payloads, $10 commit times, in append order) go into the
-- log as base+1.. of their partition, in that order. A partition that is
-- not registered fails the whole statement (nothing changes) with SQLSTATE
-- 22P02 and a text naming it. Unless $11 is NULL, the subscribers are
-- woken on that channel, as by WALAdvance. Returns whether relays moved,
-- and the number of messages appended.
WITH relay AS (
	UPDATE {{schema}}.relays SET lsn = $3, updated_at = now() WHERE slot = $1 AND lsn = $2 RETURNING 1
), msgs AS (
	SELECT m.*, row_number() OVER (PARTITION BY m.t, m.p ORDER BY m.ord) AS k
	FROM unnest($4::text[], $5::int4[], $6::text[], $7::text[], $8::text[], $9::bytea[], $10::timestamptz[])
		WITH ORDINALITY AS m(t, p, key, uuid, md, payload, at, ord)
	WHERE EXISTS (SELECT 1 FROM relay)
), counts AS (
	SELECT t, p, count(*) AS n FROM msgs GROUP BY t, p
), advanced AS (
	UPDATE {{schema}}.partitions pt SET last_seq = pt.last_seq + c.n, sequenced_at = now()
	FROM counts c WHERE pt.topic = c.t AND pt.partition = c.p
	RETURNING pt.topic, pt.partition, pt.last_seq - c.n AS base
), ins AS (
	INSERT INTO {{schema}}.log (topic, partition, seq, partition_key, uuid, metadata, payload, created_at)
	SELECT m.t, m.p, a.base + m.k, m.key, m.uuid, m.md::jsonb, m.payload, m.at
	FROM msgs m JOIN advanced a ON a.topic = m.t AND a.partition = m.p
	RETURNING 1
)
SELECT (SELECT count(*) FROM relay)::int8,
	(SELECT count(*) FROM ins)::int8,
	CASE WHEN (SELECT count(*) FROM advanced) < (SELECT count(*) FROM counts) THEN
		('relay: topic partitions not registered: ' || (SELECT string_agg(c.t || ' partition ' || c.p, ', ') FROM counts c
			WHERE NOT EXISTS (SELECT 1 FROM advanced a WHERE a.topic = c.t AND a.partition = c.p)))::int8
	END,
	CASE WHEN $11::text IS NOT NULL THEN
		(SELECT count(pg_notify($11, n.t || ':' || n.ps)) FROM (SELECT t, string_agg(p::text, ',') AS ps FROM counts GROUP BY t) n)
	END::int8;

-- name: BodiesNextIDs
-- $1 ids for bodies rows the relay copies in.
SELECT nextval('{{schema}}.bodies_id_seq') FROM generate_series(1, $1::int4);

-- name: WALEndStaleAppenders
-- $1 application_name of this slot's append connections: ends the sessions
-- of other relays' append connections (a relay frozen or cut off in the
-- middle of an append, whose transaction holds the relays row while the
-- slot's new holder waits for it). Their appends roll back whole; the
-- number of sessions ended.
SELECT count(pg_terminate_backend(a.pid))::int8
FROM pg_stat_activity a
WHERE a.application_name = $1 AND a.pid <> pg_backend_pid() AND a.state <> 'idle';
