\set off random(0, 999)
WITH ins AS (INSERT INTO b.body (partition_key, uuid, metadata, payload)
SELECT 'k' || ((g + :off) % 1000), gen_random_uuid()::text, '{"a":"b"}'::jsonb, p.payload FROM generate_series(1,100) g JOIN pool p ON p.i = (g + :off) % 1000 RETURNING id)
INSERT INTO b.pending SELECT id, 't', id % 16 FROM ins;
