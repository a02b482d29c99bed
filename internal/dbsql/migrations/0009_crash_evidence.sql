-- Crash evidence: a message is charged for a crash of its consumer process
-- only when it was the only delivery in flight in that process.
--
-- Before a message is handed out, the worker records it on the cursor row
-- as in flight: inflight_from..inflight_to (one message, or the whole batch
-- a batch handler gets; 0 when nothing is in flight), and inflight_solo,
-- whether it was the only delivery in flight in its process (the worker
-- held the process's delivery gate alone). Recording the outcome clears it.
--
-- A new lease holder that finds a delivery still in flight (its holder
-- died, was killed or froze past its lease) either charges it, when it was
-- solo: attempts grows by one plus the head's unexplained deliveries; or,
-- when other deliveries were in flight in the same process, charges nobody:
-- the messages become suspects (suspect_from..suspect_to), each delivered
-- alone from then on until it has an outcome, and the head's delivery
-- without an outcome is kept in unexplained, charged only if the message
-- later crashes a process on its own.
ALTER TABLE {{schema}}.cursors
    ADD COLUMN inflight_from bigint  NOT NULL DEFAULT 0,
    ADD COLUMN inflight_to   bigint  NOT NULL DEFAULT 0,
    ADD COLUMN inflight_solo boolean NOT NULL DEFAULT false,
    ADD COLUMN suspect_from  bigint  NOT NULL DEFAULT 0,
    ADD COLUMN suspect_to    bigint  NOT NULL DEFAULT 0,
    ADD COLUMN unexplained   integer NOT NULL DEFAULT 0;

-- The same for a held message's retries (key isolation): inflight says a
-- retry of this message was handed out and has no outcome yet,
-- inflight_solo whether it was alone in its process, unexplained its
-- retries that ended without an outcome while others were in flight.
ALTER TABLE {{schema}}.held
    ADD COLUMN inflight      boolean NOT NULL DEFAULT false,
    ADD COLUMN inflight_solo boolean NOT NULL DEFAULT false,
    ADD COLUMN unexplained   integer NOT NULL DEFAULT 0;
