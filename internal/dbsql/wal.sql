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

-- name: WALAppend
-- The relay appends the messages of whole transactions, in commit order:
-- arrays of $1 topics, $2 partitions, $3 partition keys ('' for none),
-- $4 uuids, $5 metadata (JSON), $6 payloads, $7 commit times. Each
-- partition's messages get the next seqs (the partitions row is the
-- sequencer's, so table-mode messages of the same partition interleave
-- gap-free), payloads of 1 KiB or more go into bodies as in pending.sql,
-- and relays.lsn of slot $8 moves from $9 to $10 in the same statement;
-- when it is not at $9 (another relay appended since), nothing is
-- written. Unless $11 is NULL, the subscribers are woken on that channel
-- as the sequencer wakes them. Returns whether relays moved, the rows
-- appended, and the partitions not found (both must be checked; the
-- caller rolls back otherwise).
WITH src AS MATERIALIZED (
	SELECT x.*, CASE WHEN octet_length(x.b) >= 1024 THEN nextval('{{schema}}.bodies_id_seq') END AS body_id
	FROM unnest($1::text[], $2::int4[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::timestamptz[])
		WITH ORDINALITY AS x(t, p, k, u, m, b, c, ord)
), relay AS (
	UPDATE {{schema}}.relays SET lsn = $10, updated_at = now() WHERE slot = $8 AND lsn = $9 RETURNING 1
), counts AS (
	SELECT s.t, s.p, count(*) AS n FROM src s WHERE EXISTS (SELECT 1 FROM relay) GROUP BY s.t, s.p
), advanced AS (
	UPDATE {{schema}}.partitions pt SET last_seq = pt.last_seq + c.n, sequenced_at = now()
	FROM counts c WHERE pt.topic = c.t AND pt.partition = c.p
	RETURNING pt.topic, pt.partition, pt.last_seq - c.n AS base
), numbered AS (
	SELECT s.*, a.base + row_number() OVER (PARTITION BY s.t, s.p ORDER BY s.ord) AS seq
	FROM src s JOIN advanced a ON a.topic = s.t AND a.partition = s.p
), bodies AS (
	INSERT INTO {{schema}}.bodies (id, payload) SELECT body_id, b FROM numbered WHERE body_id IS NOT NULL
), inserted AS (
	INSERT INTO {{schema}}.log (topic, partition, seq, partition_key, uuid, metadata, payload, body_id, created_at)
	SELECT t, p, seq, NULLIF(k, ''), u, m::jsonb, CASE WHEN body_id IS NULL THEN b END, body_id, c
	FROM numbered ORDER BY t, p, seq
	RETURNING 1
)
SELECT (SELECT count(*) FROM relay)::int8, (SELECT count(*) FROM inserted)::int8,
	((SELECT count(*) FROM counts) - (SELECT count(*) FROM advanced))::int8,
	CASE WHEN $11::text IS NOT NULL THEN
		(SELECT count(pg_notify($11, n.t || ':' || n.ps)) FROM (SELECT t, string_agg(p::text, ',') AS ps FROM counts GROUP BY t) n)
	END::int8;
