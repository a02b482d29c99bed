-- members: one row per live member (Subscriber instance) of a consumer
-- group on a topic, with its heartbeat and its lease TTL: a member is live
-- while heartbeat_at + ttl > now() (0011_member_expiry.sql). Heartbeats
-- are written by CursorsBalance (cursors.sql), which reads both tables in
-- one round trip.

-- name: MembersExpire
-- Forgets members expired for longer than $3 µs. $1 group, $2 topic.
DELETE FROM {{schema}}.members WHERE group_name = $1 AND topic = $2
	AND heartbeat_at + ttl < now() - $3::int8 * interval '1 microsecond';

-- name: MembersLeave
-- A member leaves the group: $1 group, $2 topic, $3 me; and, when it was
-- live, notifies the group's change on channel $4 (names.MembersChannel;
-- NULL: none), so that the others take its share at once.
WITH gone AS (
	DELETE FROM {{schema}}.members WHERE group_name = $1 AND topic = $2 AND member_id = $3
	RETURNING heartbeat_at + ttl > now() AS live
)
SELECT count(pg_notify($4, $2 || ':' || $1)) FROM gone WHERE gone.live AND $4::text IS NOT NULL;

-- name: MembersChanged
-- Notifies group $1's members of topic $2 ('' for all its topics) on
-- channel $3 (names.MembersChannel) that its cursors changed (admin's
-- pause, resume and reset): they balance at once rather than at their
-- next heartbeat. Sent when the caller's transaction commits.
SELECT pg_notify($3, $2 || ':' || $1);

-- name: MembersLockGroup
-- Admin, before deleting a group: locks its member rows ($1 group, $2 topic
-- or '' for all) in key order, so that no heartbeat is recorded until the
-- decision commits.
SELECT 1 FROM {{schema}}.members
WHERE group_name = $1 AND ($2 = '' OR topic = $2) ORDER BY topic, member_id FOR UPDATE;

-- name: MembersDeleteGroup
-- Admin: deletes group $1's members (topic $2 or '' for all).
DELETE FROM {{schema}}.members WHERE group_name = $1 AND ($2 = '' OR topic = $2);

-- name: MembersStatus
-- Admin status: the members of group $1 and topic $2 ('' for all), live
-- (heard from within their TTL) or not.
SELECT group_name, topic, member_id, joined_at, heartbeat_at, can_reject,
	heartbeat_at + ttl > now()
FROM {{schema}}.members
WHERE ($1 = '' OR group_name = $1) AND ($2 = '' OR topic = $2)
ORDER BY group_name, topic, member_id;
