-- The log-based publishing mode (relay package): publishers write each
-- message into the WAL with pg_logical_emit_message, and one relay per
-- schema reads them from a logical replication slot and appends them to
-- log. relays holds what that relay has appended: the commit LSN of the
-- last transaction whose messages are in log, written in the same
-- transaction as those rows. After a crash the relay skips every
-- transaction at or below it, so each message gets its seq exactly once,
-- and a relay that finds the row changed under it (another relay took over)
-- stops instead of appending twice.
CREATE TABLE {{schema}}.relays (
    slot       text        PRIMARY KEY,
    lsn        bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
