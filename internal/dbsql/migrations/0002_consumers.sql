-- Consumer groups: one cursor and one lease per (group, topic, partition),
-- in the same row, so that every cursor write can be fenced by the lease in
-- the same statement.
CREATE TABLE {{schema}}.cursors (
    group_name       text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    -- seq of the last message the group finished in this partition (0: none).
    seq              bigint      NOT NULL DEFAULT 0,
    -- The lease: who works on the partition, its fencing token (incremented
    -- on every acquisition) and when it ends unless renewed.
    lease_owner      text,
    lease_token      bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    -- Operations and status.
    paused           boolean     NOT NULL DEFAULT false,
    attempts         integer     NOT NULL DEFAULT 0,
    last_error       text,
    last_error_at    timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, topic, partition)
);

-- Live members of a group on a topic, for an even split of the partitions.
CREATE TABLE {{schema}}.members (
    group_name   text        NOT NULL,
    topic        text        NOT NULL,
    member_id    text        NOT NULL,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, topic, member_id)
);
