-- A member's expiry is stored on its row: ttl is how long after
-- heartbeat_at the member counts as live, its own lease TTL, written by
-- each heartbeat (CursorsBalance). Every statement that asks whether a
-- member is live tests heartbeat_at + ttl > now(), so that no reader
-- needs a timeout of its own: before, the lease manager counted other
-- members live for its own lease TTL, and admin, retention and metrics
-- for a MemberTimeout each (30 s by default, whatever the members' TTL).
--
-- The TTL is stored rather than the expiry itself so that a member of an
-- older release, which keeps running during a rolling deploy and writes
-- heartbeat_at alone, stays live as it was for admin, retention and
-- metrics before: 30 s (the default here, and of the old MemberTimeout)
-- after each of its heartbeats.
ALTER TABLE {{schema}}.members
    ADD COLUMN ttl interval NOT NULL DEFAULT interval '30 seconds';
