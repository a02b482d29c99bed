DROP SCHEMA IF EXISTS a CASCADE; DROP SCHEMA IF EXISTS b CASCADE; DROP SCHEMA IF EXISTS c CASCADE;
DROP TABLE IF EXISTS pool;
CREATE TABLE pool AS SELECT i, convert_to((SELECT string_agg(md5(random()::text || i || j), '') FROM generate_series(1, :sz/32) j), 'UTF8') AS payload FROM generate_series(0,999) i;
CREATE SCHEMA a; CREATE SCHEMA b; CREATE SCHEMA c;
-- A: copy layout (today)
CREATE TABLE a.partitions (topic text, partition int, last_seq bigint NOT NULL DEFAULT 0, PRIMARY KEY(topic,partition));
INSERT INTO a.partitions SELECT 't', p FROM generate_series(0,15) p;
CREATE TABLE a.pending (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text NOT NULL, partition int NOT NULL, partition_key text, uuid text NOT NULL, metadata jsonb NOT NULL, payload bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE a.log (topic text NOT NULL, partition int NOT NULL, seq bigint NOT NULL, partition_key text, uuid text NOT NULL, metadata jsonb NOT NULL, payload bytea NOT NULL, created_at timestamptz NOT NULL, sequenced_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY(topic,partition,seq));
-- B: body table + thin pending + thin log
CREATE TABLE b.partitions (LIKE a.partitions INCLUDING ALL); INSERT INTO b.partitions SELECT * FROM a.partitions;
CREATE TABLE b.body (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, partition_key text, uuid text NOT NULL, metadata jsonb NOT NULL, payload bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE b.pending (id bigint PRIMARY KEY, topic text NOT NULL, partition int NOT NULL);
CREATE TABLE b.log (topic text NOT NULL, partition int NOT NULL, seq bigint NOT NULL, body_id bigint NOT NULL, sequenced_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY(topic,partition,seq));
-- C: one table, seq set in place by UPDATE
CREATE TABLE c.partitions (LIKE a.partitions INCLUDING ALL); INSERT INTO c.partitions SELECT * FROM a.partitions;
CREATE TABLE c.msg (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text NOT NULL, partition int NOT NULL, seq bigint, partition_key text, uuid text NOT NULL, metadata jsonb NOT NULL, payload bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), sequenced_at timestamptz);
CREATE INDEX ON c.msg (id) WHERE seq IS NULL;
CREATE UNIQUE INDEX ON c.msg (topic, partition, seq) WHERE seq IS NOT NULL;
