-- Stall-proof delivery: every delivery is counted before the message is
-- handed out, backoff survives restarts, and a group's members say whether
-- they can take a message out of the stream.

-- deliveries counts the deliveries of the partition's next message
-- (cursor + 1) that were started, written once per batch before the batch
-- is handed out; attempts counts those that ended in a recorded failure.
-- When a new lease holder finds deliveries > attempts, the difference
-- ended without an outcome (the process died, was killed or froze past its
-- lease) and is counted as failed attempts, so that a message that crashes
-- its consumer reaches MaxAttempts like one that fails. Advance resets both.
-- backoff_until is when the partition's next retry is due after a failure:
-- a restart or a lease move keeps the backoff instead of retrying at once.
ALTER TABLE {{schema}}.cursors
    ADD COLUMN deliveries    integer NOT NULL DEFAULT 0,
    ADD COLUMN backoff_until timestamptz;

-- can_reject: whether the member has a RejectHandler, i.e. can take a
-- message out of the stream (dead letter) after Reject or MaxAttempts. A
-- group whose live members cannot retries a poison message for ever; the
-- admin status says so. joined_at: when the member joined the group.
ALTER TABLE {{schema}}.members
    ADD COLUMN can_reject boolean     NOT NULL DEFAULT true,
    ADD COLUMN joined_at  timestamptz NOT NULL DEFAULT now();
