\set off random(0, 999)
INSERT INTO c.msg (topic, partition, partition_key, uuid, metadata, payload)
SELECT 't', g % 16, 'k' || ((g + :off) % 1000), gen_random_uuid()::text, '{"a":"b"}'::jsonb, p.payload FROM generate_series(1,100) g JOIN pool p ON p.i = (g + :off) % 1000;
