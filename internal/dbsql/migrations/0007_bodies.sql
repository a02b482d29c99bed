-- Large payloads are written once. A payload of 1 KiB or more (the
-- publish statements in pending.sql decide) is stored in bodies when it is
-- published, and pending and log carry only its id (body_id, payload NULL):
-- the sequencer moves a few dozen bytes instead of copying the payload,
-- which for a TOASTed value means reading it back and writing it again.
-- Smaller payloads stay inline, where one row is cheaper than two. Measured
-- with pgbench before the change (docs/bench-results/layout/): publishing
-- and sequencing took 0.63x the time at 1 KiB, 0.36x at 4 KiB and 0.42x at
-- 64 KiB, and 1.14x at 256 bytes, hence the threshold.
--
-- A body is deleted with its log row (LogTrim); nothing else references it.
CREATE SEQUENCE {{schema}}.bodies_id_seq;

CREATE TABLE {{schema}}.bodies (
    id      bigint PRIMARY KEY,
    payload bytea  NOT NULL
);

ALTER SEQUENCE {{schema}}.bodies_id_seq OWNED BY {{schema}}.bodies.id;

ALTER TABLE {{schema}}.pending
    ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN body_id bigint,
    ADD CONSTRAINT pending_payload_or_body CHECK ((payload IS NULL) <> (body_id IS NULL));

ALTER TABLE {{schema}}.log
    ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN body_id bigint,
    ADD CONSTRAINT log_payload_or_body CHECK ((payload IS NULL) <> (body_id IS NULL));
