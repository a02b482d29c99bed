-- Core tables of the outbox. {{schema}} is replaced by the validated,
-- quoted schema name; everything else reaches the server as bind parameters.

-- A topic and its fixed partition count.
CREATE TABLE {{schema}}.topics (
    name        text        PRIMARY KEY,
    partitions  integer     NOT NULL CHECK (partitions BETWEEN 1 AND 1024),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per (topic, partition): the sequencer's per-partition lock and
-- high-water mark. Only the sequencer writes it, one sequencer per partition
-- at a time (SELECT ... FOR UPDATE SKIP LOCKED); publishers never touch it.
CREATE TABLE {{schema}}.partitions (
    topic        text        NOT NULL REFERENCES {{schema}}.topics (name),
    partition    integer     NOT NULL,
    last_seq     bigint      NOT NULL DEFAULT 0,
    sequenced_at timestamptz,
    PRIMARY KEY (topic, partition)
);

-- Messages written by publishers inside their own transactions and not yet
-- sequenced. The identity's sequence must keep CACHE 1 (the default): ids
-- must grow in real time across sessions, because the sequencer orders the
-- committed rows of a partition by id, and two transactions serialized on
-- a key must keep their commit order.
CREATE TABLE {{schema}}.pending (
    -- The only index: an increasing key is appended at the right edge of
    -- the btree, the cheapest index a publisher can maintain.
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    partition_key text,
    uuid          text        NOT NULL,
    metadata      jsonb       NOT NULL,
    payload       bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- The sequenced log: gap-free seq per (topic, partition), assigned after
-- commit, in commit-visibility order.
CREATE TABLE {{schema}}.log (
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    seq           bigint      NOT NULL,
    partition_key text,
    uuid          text        NOT NULL,
    metadata      jsonb       NOT NULL,
    payload       bytea       NOT NULL,
    created_at    timestamptz NOT NULL,
    sequenced_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, seq)
);
