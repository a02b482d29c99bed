-- topics: the registered topics and their partition counts.

-- name: TopicsRegister
-- Registers topic $1 with $2 partitions, forwarder-only when $3
-- (0016_forward_only.sql), and creates its partition rows, in one
-- statement. No row: the topic exists already (read it with
-- TopicsPartitions; when another instance registers it at the same moment,
-- this statement waits for it and its snapshot cannot see that row yet).
WITH ins AS (
	INSERT INTO {{schema}}.topics (name, partitions, forward_only) VALUES ($1, $2, $3)
	ON CONFLICT (name) DO NOTHING
	RETURNING name, partitions
), parts AS (
	INSERT INTO {{schema}}.partitions (topic, partition)
	SELECT name, g FROM ins, generate_series(0, ins.partitions - 1) AS g
)
SELECT partitions FROM ins;

-- name: TopicsPartitions
-- The partition count of topic $1.
SELECT partitions FROM {{schema}}.topics WHERE name = $1;

-- name: TopicsForwardOnly
-- The partition count of topic $1 and whether it is forwarder-only.
SELECT partitions, forward_only FROM {{schema}}.topics WHERE name = $1;

-- name: TopicsForwardOnlyNames
-- The forwarder-only topics (the log-based relay puts their messages into
-- pending).
SELECT name FROM {{schema}}.topics WHERE forward_only;

-- name: TopicsStatus
-- Admin status: topic $1 ('' for all) with its partition count, the
-- messages sequenced so far (forwarded, for a forwarder-only topic), those
-- still pending, and whether it is forwarder-only.
SELECT t.name, t.partitions,
	coalesce((SELECT sum(p.last_seq) FROM {{schema}}.partitions p WHERE p.topic = t.name), 0)::int8,
	(SELECT count(*) FROM {{schema}}.pending m WHERE m.topic = t.name),
	t.forward_only
FROM {{schema}}.topics t WHERE $1 = '' OR t.name = $1 ORDER BY t.name;

-- name: TopicsIncarnation
-- The incarnation of topic $1: its registration time in microseconds since
-- the Unix epoch. A topic dropped and registered again numbers its messages
-- from 1 again, under a new incarnation (MetadataIncarnation).
SELECT (extract(epoch FROM created_at) * 1000000)::int8 FROM {{schema}}.topics WHERE name = $1;
