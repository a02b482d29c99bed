-- published: what a topic holds, sequenced or not, for the assertions of
-- package outboxtest (RequirePublished). Run in the caller's transaction,
-- it sees that transaction's own uncommitted messages too.

-- name: PublishedOfTopic
-- Every message of topic $1: the log's in (partition, seq) order, then the
-- pending ones (seq NULL) in publish order; at most $2 rows.
SELECT seq, partition, partition_key, uuid, metadata, payload, created_at FROM (
	SELECT 0 AS grp, row_number() OVER (ORDER BY l.partition, l.seq) AS ord,
		l.seq, l.partition, coalesce(l.partition_key, '') AS partition_key, l.uuid, l.metadata::text AS metadata,
		coalesce(l.payload, (SELECT b.payload FROM {{schema}}.bodies b WHERE b.id = l.body_id)) AS payload, l.created_at
	FROM {{schema}}.log l WHERE l.topic = $1
	UNION ALL
	SELECT 1, p.id, NULL::int8, p.partition, coalesce(p.partition_key, ''), p.uuid, p.metadata::text,
		coalesce(p.payload, (SELECT b.payload FROM {{schema}}.bodies b WHERE b.id = p.body_id)), p.created_at
	FROM {{schema}}.pending p WHERE p.topic = $1
) AS m
ORDER BY grp, ord
LIMIT $2;
