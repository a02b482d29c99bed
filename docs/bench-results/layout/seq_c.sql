BEGIN;
SELECT 1 FROM c.partitions WHERE topic='t' FOR UPDATE;
WITH picked AS (SELECT m.id, m.topic, m.partition FROM c.msg m WHERE seq IS NULL ORDER BY m.id LIMIT 1000),
numbered AS (SELECT pk.*, p.last_seq + row_number() OVER (PARTITION BY pk.topic, pk.partition ORDER BY pk.id) AS seq FROM picked pk JOIN c.partitions p ON p.topic = pk.topic AND p.partition = pk.partition),
upd AS (UPDATE c.msg m SET seq = n.seq, sequenced_at = now() FROM numbered n WHERE m.id = n.id RETURNING m.topic, m.partition, m.seq)
UPDATE c.partitions p SET last_seq = x.max_seq FROM (SELECT topic, partition, max(seq) AS max_seq FROM upd GROUP BY 1,2) x WHERE p.topic = x.topic AND p.partition = x.partition;
COMMIT;
