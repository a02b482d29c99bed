-- The adaptive state of each (group, topic, partition) worker, written only
-- when it changes (degrade, recover), for the admin status.
ALTER TABLE {{schema}}.cursors
    ADD COLUMN adaptive_state text    NOT NULL DEFAULT 'normal',
    ADD COLUMN batch_size     integer;
