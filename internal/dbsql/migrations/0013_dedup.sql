-- Publish-side deduplication (outbox.DedupKey): a message published with a
-- dedup key is stored only if no other message of its topic claimed the
-- same key within the topic's window (PublisherConfig.DedupWindow,
-- DedupWindows). The claim is a row here, written by the publish statement
-- (dedup_keys.sql) in the caller's transaction, in the same statement as
-- the message: it exists if and only if that transaction commits, so a
-- rollback frees the key again. expires_at is when the key may be claimed
-- again (the claim's time plus the window); the retention vacuum deletes
-- the rows past it, through the index on expires_at.
CREATE TABLE {{schema}}.dedup_keys (
    topic      text        NOT NULL,
    dedup_key  text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (topic, dedup_key)
);

CREATE INDEX dedup_keys_expires_at ON {{schema}}.dedup_keys (expires_at);

-- Rows come and go with the windows: a vacuum after 2% of them died, as
-- for log and bodies (0012_churn.sql), lets new claims reuse their space.
ALTER TABLE {{schema}}.dedup_keys SET (autovacuum_vacuum_scale_factor = 0.02);
