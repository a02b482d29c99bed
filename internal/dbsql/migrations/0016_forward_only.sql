-- Forwarder-only topics (issue 40): a topic registered with
-- outbox.ForwardOnly is read by one Forwarder and no Subscriber. Its
-- messages are not copied into log and bodies: the forwarder reads them
-- from pending, numbers each partition's from its cursor, and deletes them
-- in the transaction that records them forwarded (PendingForwarded). The
-- sequencer leaves them alone (PartitionsLockPending, PendingAny).
ALTER TABLE {{schema}}.topics ADD COLUMN forward_only boolean NOT NULL DEFAULT false;
