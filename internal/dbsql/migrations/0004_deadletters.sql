-- Dead letters: messages taken out of their stream as poison (package
-- deadletter). A message from the outbox log is identified by its position
-- (group, topic, partition, seq), so that a retried write never duplicates
-- it; a message from elsewhere (partition and seq NULL) by its uuid.
CREATE TABLE {{schema}}.dead_letters (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_name       text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer,
    seq              bigint,
    uuid             text        NOT NULL,
    partition_key    text,
    metadata         jsonb       NOT NULL,
    payload          bytea       NOT NULL,
    reason           text        NOT NULL,
    attempts         integer     NOT NULL DEFAULT 0,
    first_failure_at timestamptz NOT NULL,
    last_failure_at  timestamptz NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'replayed', 'discarded')),
    -- Where and as what the entry was published again (status replayed).
    replay_topic     text,
    replay_uuid      text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((partition IS NULL) = (seq IS NULL)),
    UNIQUE (group_name, topic, partition, seq)
);
CREATE UNIQUE INDEX dead_letters_external_idx ON {{schema}}.dead_letters (group_name, topic, uuid)
    WHERE seq IS NULL;
-- Pending entries per partition, for the admin status.
CREATE INDEX dead_letters_pending_idx ON {{schema}}.dead_letters (group_name, topic, partition)
    WHERE status = 'pending';
-- Time ranges and purges.
CREATE INDEX dead_letters_created_idx ON {{schema}}.dead_letters (created_at);
