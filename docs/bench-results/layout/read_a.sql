\set part random(0, 15)
SELECT seq, uuid, partition_key, metadata, payload FROM a.log WHERE topic='t' AND partition=:part AND seq > 0 ORDER BY seq LIMIT 1000;
