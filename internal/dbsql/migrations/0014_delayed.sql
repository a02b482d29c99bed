-- Delayed delivery (outbox.DeliverAt): a message is not sequenced, and so
-- not delivered, before its time, and by default the later messages of its
-- key wait behind it (docs/architecture.md, "Delayed delivery").
--
-- The publish statements set both columns from the message's metadata
-- (outbox_deliver_at, outbox_unordered) as they insert it: deliver_at is
-- its time, holds whether it holds its key back until then (it has a key
-- and is not unordered). The sequencer moves a row once its time has come
-- and no earlier row of its key holds it; while no row is delayed, a
-- single probe of the partial index below tells it so, and it reads pending
-- as before.
ALTER TABLE {{schema}}.pending
    ADD COLUMN deliver_at timestamptz,
    ADD COLUMN holds boolean NOT NULL DEFAULT false;

-- The delayed rows by due time: the sequencer wakes at the earliest, and
-- status counts them.
CREATE INDEX pending_delayed ON {{schema}}.pending (deliver_at) WHERE deliver_at IS NOT NULL;

-- The rows that hold their key back: a later row of the key waits while
-- one of these is not due.
CREATE INDEX pending_holds ON {{schema}}.pending (topic, partition_key, id) WHERE holds;

-- Whether a pending row (its topic, key, id, deliver_at and whether it is
-- unordered) may be sequenced at time now: its time has come, and it is
-- unkeyed, unordered, or no earlier row of its key holds the key back
-- until later. STABLE and inlined into the sequencer's statements.
CREATE FUNCTION {{schema}}.pending_movable(p_topic text, p_key text, p_id bigint, p_deliver_at timestamptz, p_unordered boolean, p_now timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT (p_deliver_at IS NULL OR p_deliver_at <= p_now)
        AND (p_key IS NULL OR p_unordered OR NOT EXISTS (
            SELECT 1 FROM {{schema}}.pending h
            WHERE h.holds AND h.topic = p_topic AND h.partition_key = p_key AND h.id < p_id AND h.deliver_at > p_now))
$$;
