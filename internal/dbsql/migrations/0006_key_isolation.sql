-- Key-level isolation: a message that fails is held back with every later
-- message of its partition key, while the other keys of the partition go
-- on. The cursor row's seq is then how far the worker has scanned the
-- partition: everything at or below it was delivered or is held here.
-- What the group has finished is everything below the lowest held seq, and
-- at or below the scan position (finished_seq); retention, the status and
-- the metrics use that, never the scan position alone.
CREATE TABLE {{schema}}.held (
    group_name       text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    seq              bigint      NOT NULL,
    -- NULL: a keyless message, held alone (keyless messages carry no order,
    -- so none waits behind another).
    partition_key    text,
    -- Of the key's first held message (its head); later ones wait at 0.
    -- deliveries counts the head's retries started, attempts those that
    -- failed; a new lease holder counts the difference as failed attempts
    -- (deliveries that ended without an outcome), as on the cursor row.
    attempts         integer     NOT NULL DEFAULT 0,
    deliveries       integer     NOT NULL DEFAULT 0,
    last_error       text,
    first_failure_at timestamptz,
    last_error_at    timestamptz,
    -- When the head's next retry is due (NULL: at once).
    retry_at         timestamptz,
    -- An operator's request the lease holder carries out: 'dead_letter'.
    requested        text CHECK (requested IN ('dead_letter')),
    held_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, topic, partition, seq),
    FOREIGN KEY (group_name, topic, partition) REFERENCES {{schema}}.cursors ON DELETE CASCADE
);

-- isolation_full: since when the partition blocks as it would without key
-- isolation, because holding one more key or message would pass the
-- Subscriber's bounds (MaxHeldKeys, MaxHeldMessages); NULL: it does not.
ALTER TABLE {{schema}}.cursors ADD COLUMN isolation_full timestamptz;

-- The last seq a group has finished in a partition, given its scan
-- position: below the lowest held message, at most the scan position.
CREATE FUNCTION {{schema}}.finished_seq(g text, t text, p integer, scanned bigint) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT least(scanned, coalesce((SELECT min(h.seq) FROM {{schema}}.held h
        WHERE h.group_name = g AND h.topic = t AND h.partition = p) - 1, scanned))
$$;
