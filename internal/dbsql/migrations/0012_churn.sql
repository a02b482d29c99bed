-- Storage parameters for the tables that churn, so that they stay small on
-- disk at any rate, for months (docs/postgresql.md, "The tables that churn").
--
-- pending is a queue: every message is inserted by a publisher and deleted
-- by the sequencer a few milliseconds later, so it holds a few live rows
-- and, between two vacuums, every row deleted since the last. The
-- sequencer's statements read it from the left edge of its primary key,
-- which is where the deleted rows' index entries pile up, so their cost
-- grows with the rows deleted since the last vacuum, not with the live
-- ones. With the default scale factor (20% of the live rows, about 0 here)
-- autovacuum already takes it at every visit; what the defaults get wrong
-- is the pace of that vacuum: a cost delay of 2 ms makes a vacuum of a
-- table that churns at thousands of rows a second sleep while the next
-- rows die. No cost delay here: vacuuming a table of a few pages costs
-- milliseconds. The threshold makes the rule explicit: vacuum once 1,000
-- rows died, whatever the live count.
ALTER TABLE {{schema}}.pending SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- partitions (last_seq, one update per partition per sequencer pass),
-- cursors (a consumer group's position and lease, one update per batch and
-- heartbeat), members (heartbeats) and relays (the log-based relay's
-- position) are a few rows updated all the time. No index covers an
-- updated column, so each update can be a HOT update, one that needs no
-- new index entry and whose old version the next reader of the page prunes,
-- provided the page has room for the new version: fillfactor 50 keeps half
-- of each page free for that. (It applies to pages filled from now on; a
-- table migrated with rows already in it gets it as they move.) Pruning
-- frees room in a page but does not record it in the free space map, and
-- an update that finds its page full (pruning needs the page to itself,
-- which concurrent updaters deny it) goes to a new page at the end of the
-- table: in a soak at 1,000 msg/s cursors grew by a page a few times a
-- minute while its dead rows, pruned as they came, never reached the
-- default threshold. A vacuum after 100 dead rows, with no cost delay,
-- records the free space at every autovacuum visit, so that those updates
-- land in pages already there.
ALTER TABLE {{schema}}.partitions SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 100,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE {{schema}}.cursors SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 100,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE {{schema}}.members SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 100,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE {{schema}}.relays SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 100,
    autovacuum_vacuum_cost_delay = 0
);

-- log and bodies grow with the retention window and shrink as retention
-- deletes the oldest rows, in bulk. A vacuum after 2% of the rows died
-- (instead of 20%) lets new rows reuse that space before the table grows
-- past the window; the cost delay stays the server's, since these tables
-- can be large.
ALTER TABLE {{schema}}.log SET (autovacuum_vacuum_scale_factor = 0.02);
ALTER TABLE {{schema}}.bodies SET (autovacuum_vacuum_scale_factor = 0.02);
