-- inbox_marks: the inbox's high-water marks, one row per (consumer, source
-- topic, source partition): the incarnation of the topic and the highest
-- seq whose effects committed. Lives in the consumer's database, in the
-- schema inbox.Migrate created it in.

-- name: InboxCreateTable
CREATE TABLE IF NOT EXISTS {{schema}}.inbox_marks (
	consumer    text        NOT NULL,
	topic       text        NOT NULL,
	partition   integer     NOT NULL,
	incarnation bigint      NOT NULL,
	seq         bigint      NOT NULL,
	updated_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, topic, partition)
);

-- name: InboxEnsure
-- Makes sure the mark row exists ($1 consumer, $2 topic, $3 partition), so
-- that InboxLock always has a row to lock.
INSERT INTO {{schema}}.inbox_marks (consumer, topic, partition, incarnation, seq)
VALUES ($1, $2, $3, 0, 0) ON CONFLICT DO NOTHING;

-- name: InboxLock
-- The mark, locked until the transaction ends: concurrent deliveries of one
-- source partition to one consumer wait for each other here.
SELECT incarnation, seq FROM {{schema}}.inbox_marks
WHERE consumer = $1 AND topic = $2 AND partition = $3 FOR UPDATE;

-- name: InboxAdvance
-- Records that the message at seq $5 of incarnation $4 took effect.
UPDATE {{schema}}.inbox_marks SET incarnation = $4, seq = $5, updated_at = now()
WHERE consumer = $1 AND topic = $2 AND partition = $3;
