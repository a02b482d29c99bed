-- The log-based mode: publishing into the WAL, the relay's slot and its
-- appends to the log. {{wal}} is the quoted name of the schema's
-- publication (and, as a bind parameter, of its slot): the schema name
-- followed by _wal.

-- name: WALEmit
-- Many messages: $1 slot, $2 prefix, $3 records (internal/walrecord),
-- written in array order, each only if the transaction commits, and only
-- if a relay can read them: wal_emit (0010_wal_emit.sql) fails with
-- SQLSTATE WO001 (wal_level) or WO002..WO004 (the slot) otherwise.
SELECT {{schema}}.wal_emit($1, $2, $3::bytea[]);

-- name: WALEmitOne
-- One message: $1 slot, $2 prefix, $3 record.
SELECT {{schema}}.wal_emit($1, $2, ARRAY[$3::bytea]);

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
-- Not transactional: the slot is gone even if the transaction that drops
-- it rolls back, so DropSlot runs it last.
SELECT pg_drop_replication_slot($1);

-- name: WALSlotState
-- $1 slot: whether it exists in this database, and its wal_status.
SELECT count(*) > 0, coalesce(max(wal_status), '')
FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database();

-- name: WALDropLock
-- $1 slot: takes the lock every publish into the slot holds shared until
-- its transaction ends (wal_emit), exclusively for this session (until
-- WALDropUnlock), without waiting; false while a transaction that
-- published into the slot is open. Publishes wait meanwhile.
SELECT pg_try_advisory_lock(hashtextextended('watermill-outbox wal ' || $1, 0));

-- name: WALDropUnlock
-- $1 slot: releases WALDropLock.
SELECT pg_advisory_unlock(hashtextextended('watermill-outbox wal ' || $1, 0));

-- name: WALFlush
-- In a transaction of its own: sets synchronous_commit = on for it, so
-- that its commit flushes the server's WAL up to there, and logical
-- decoding, which reads only flushed WAL, sees the transactions committed
-- before it with synchronous_commit = off. (A transaction commits
-- synchronously only if it wrote WAL: it writes a logical message no relay
-- takes for its own, under a prefix no schema has.)
SELECT set_config('synchronous_commit', 'on', true), pg_logical_emit_message(true, 'watermill-outbox flush', '');

-- name: WALPublishers
-- $1 slot: the server process ids of the open transactions that published
-- into the slot (they hold wal_emit's lock shared).
WITH k AS (SELECT hashtextextended('watermill-outbox wal ' || $1, 0) AS k)
SELECT coalesce(array_agg(l.pid ORDER BY l.pid), '{}')
FROM pg_locks l, k
WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = ((k.k >> 32) & 4294967295)::oid AND l.objid = (k.k & 4294967295)::oid AND l.objsubid = 1
	AND l.mode = 'ShareLock' AND l.granted AND l.pid <> pg_backend_pid();

-- name: WALUnrelayed
-- $1 slot, $2 its publication as pgoutput reads it (a quoted identifier),
-- $3 the records' prefix followed by a NUL byte, $4 the most rows to
-- decode: the messages of the schema committed in the slot and not yet
-- appended to the log (their transaction's commit LSN above relays.lsn),
-- read without consuming them, the bytes of their records, and the rows
-- decoded (when $4 or more, decoding stopped early and there may be more).
-- Decodes the WAL the slot keeps; fails with SQLSTATE 55006 while a relay
-- streams the slot. pgoutput rows: 'B' (66) begin with the commit LSN at
-- bytes 2..9, 'M' (77) message with the prefix from byte 11, 'C' commit;
-- transactions come whole, in commit order.
WITH c AS (
	SELECT c.data,
		max(CASE WHEN get_byte(c.data, 0) = 66 THEN ('x' || encode(substr(c.data, 2, 8), 'hex'))::bit(64)::int8 END) OVER (ORDER BY c.ord) AS commit_lsn
	FROM pg_logical_slot_peek_binary_changes($1, NULL, $4::int4, 'proto_version', '1', 'publication_names', $2, 'messages', 'true')
		WITH ORDINALITY AS c(lsn, xid, data, ord)
), m AS (
	SELECT length(c.data) - 14 - length($3::bytea) AS bytes FROM c
	WHERE get_byte(c.data, 0) = 77 AND substr(c.data, 11, length($3::bytea)) = $3::bytea
		AND c.commit_lsn > coalesce((SELECT r.lsn FROM {{schema}}.relays r WHERE r.slot = $1), 0)
)
SELECT (SELECT count(*) FROM m)::int8, (SELECT coalesce(sum(m.bytes), 0) FROM m)::int8, (SELECT count(*) FROM c)::int8;

-- name: WALSlotHolder
-- $1 slot: the server process streaming it (0: none) and who it serves: a
-- relay's replication connection is named 'watermill-outbox relay '
-- followed by the relay's instance (relay.ReplicationNamePrefix,
-- relay.Config.Instance), which is returned; any other session's whole
-- application_name (pg_recvlogical, or the session creating the slot).
SELECT coalesce(s.active_pid, 0)::int4,
	CASE WHEN a.application_name LIKE 'watermill-outbox relay %' THEN substr(a.application_name, 24) ELSE coalesce(a.application_name, '') END
FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
WHERE s.slot_name = $1;

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
-- registered, or whose topic is forwarder-only (its messages go into
-- pending, never the log), is missing from the result (the caller rolls
-- back). Unless $7
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
		AND NOT EXISTS (SELECT 1 FROM {{schema}}.topics tp WHERE tp.name = c.t AND tp.forward_only)
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
-- not registered, or whose topic is forwarder-only, fails the whole
-- statement (nothing changes) with SQLSTATE 22P02 and a text naming it. Unless $11 is NULL, the subscribers are
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
		AND NOT EXISTS (SELECT 1 FROM {{schema}}.topics tp WHERE tp.name = c.t AND tp.forward_only)
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

-- name: WALAppendPending
-- A whole append whose messages all go into pending, in one statement
-- (autocommit, one round trip): the messages of forwarder-only topics
-- (their forwarder reads them there), delayed ones and those their keys
-- hold back. relays.lsn of slot $1 moves from $2 to $3 (when it is not at
-- $2, another relay appended since, and nothing happens), and the
-- messages, arrays of $4 topics, $5 partitions, $6 keys ('' for none), $7
-- uuids, $8 metadata (JSON), $9 payloads, $10 commit times (created_at),
-- $11 delivery times (NULL: not delayed) and $12 whether each holds its
-- key back, go into pending in that order (their ids in commit order).
-- Unless $13 is NULL, the forwarders are woken on that channel when it
-- commits, with payload $14. Returns whether relays moved, and the rows
-- inserted.
WITH relay AS (
	UPDATE {{schema}}.relays SET lsn = $3, updated_at = now() WHERE slot = $1 AND lsn = $2 RETURNING 1
), ins AS (
	INSERT INTO {{schema}}.pending (topic, partition, partition_key, uuid, metadata, payload, created_at, deliver_at, holds)
	SELECT t, p, NULLIF(k, ''), u, m::jsonb, b, at, due, h
	FROM unnest($4::text[], $5::int4[], $6::text[], $7::text[], $8::text[], $9::bytea[], $10::timestamptz[], $11::timestamptz[], $12::bool[])
		WITH ORDINALITY AS x(t, p, k, u, m, b, at, due, h, ord)
	WHERE EXISTS (SELECT 1 FROM relay)
	ORDER BY ord
	RETURNING 1
)
SELECT (SELECT count(*) FROM relay)::int8,
	(SELECT count(*) FROM ins)::int8,
	(SELECT count(pg_notify($13, $14)) FROM relay WHERE $13::text IS NOT NULL)::int8;

-- name: PendingNotify
-- Wakes the forwarders of forwarder-only topics on channel $1 with payload
-- $2 when the transaction commits (the relay's append that put their
-- messages into pending with PendingInsertRelayed).
SELECT pg_notify($1, $2);

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
