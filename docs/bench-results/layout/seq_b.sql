BEGIN;
SELECT 1 FROM b.partitions WHERE topic='t' FOR UPDATE;
WITH picked AS (SELECT m.ctid AS tid FROM b.pending m ORDER BY m.id LIMIT 1000),
moved AS (DELETE FROM b.pending d WHERE d.ctid = ANY (ARRAY(SELECT tid FROM picked)) RETURNING d.*),
numbered AS (SELECT mv.*, p.last_seq + row_number() OVER (PARTITION BY mv.topic, mv.partition ORDER BY mv.id) AS seq FROM moved mv JOIN b.partitions p ON p.topic = mv.topic AND p.partition = mv.partition),
inserted AS (INSERT INTO b.log (topic, partition, seq, body_id) SELECT topic, partition, seq, id FROM numbered ORDER BY topic, partition, seq RETURNING topic, partition, seq)
UPDATE b.partitions p SET last_seq = x.max_seq FROM (SELECT topic, partition, max(seq) AS max_seq FROM inserted GROUP BY 1,2) x WHERE p.topic = x.topic AND p.partition = x.partition;
COMMIT;
