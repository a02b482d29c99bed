-- inbox_marks: the inbox's high-water marks, one row per (consumer, source
-- database, source topic, source partition): the incarnation of the topic
-- and the highest seq whose effects committed. source is the outbox_source
-- of the messages ('' from a forwarder without one): two databases number
-- their messages alike. Lives in the consumer's database, in the schema
-- inbox.Migrate created it in.

-- name: InboxCreateTable
CREATE TABLE IF NOT EXISTS {{schema}}.inbox_marks (
	consumer    text        NOT NULL,
	source      text        NOT NULL DEFAULT '',
	topic       text        NOT NULL,
	partition   integer     NOT NULL,
	incarnation bigint      NOT NULL,
	seq         bigint      NOT NULL,
	updated_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, source, topic, partition)
);

-- name: InboxHasSource
-- Whether the table has its source column (a table of an older release
-- has not: InboxAddSource adds it).
SELECT EXISTS (SELECT 1 FROM pg_attribute
	WHERE attrelid = '{{schema}}.inbox_marks'::regclass AND attname = 'source' AND NOT attisdropped);

-- name: InboxAddSource
-- Upgrades a table of an older release: its marks are of forwarders
-- without a source ('').
ALTER TABLE {{schema}}.inbox_marks
	ADD COLUMN source text NOT NULL DEFAULT '',
	DROP CONSTRAINT inbox_marks_pkey,
	ADD PRIMARY KEY (consumer, source, topic, partition);

-- name: InboxEnsure
-- Makes sure the mark row exists ($1 consumer, $2 topic, $3 partition, $4
-- source), so that InboxLock always has a row to lock.
INSERT INTO {{schema}}.inbox_marks (consumer, topic, partition, source, incarnation, seq)
VALUES ($1, $2, $3, $4, 0, 0) ON CONFLICT DO NOTHING;

-- name: InboxLock
-- The mark, locked until the transaction ends: concurrent deliveries of one
-- source partition to one consumer wait for each other here.
SELECT incarnation, seq FROM {{schema}}.inbox_marks
WHERE consumer = $1 AND topic = $2 AND partition = $3 AND source = $4 FOR UPDATE;

-- name: InboxAdvance
-- Records that the message at seq $5 of incarnation $4 took effect ($6
-- source).
UPDATE {{schema}}.inbox_marks SET incarnation = $4, seq = $5, updated_at = now()
WHERE consumer = $1 AND topic = $2 AND partition = $3 AND source = $6;
