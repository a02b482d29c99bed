\set part random(0, 15)
SELECT l.seq, b.uuid, b.partition_key, b.metadata, b.payload FROM b.log l JOIN b.body b ON b.id = l.body_id WHERE l.topic='t' AND l.partition=:part AND l.seq > 0 ORDER BY l.seq LIMIT 1000;
