// Package lease splits the partitions of a topic among the live members of a
// consumer group and fences every cursor write by the lease it was made
// under.
//
// Each (group, topic, partition) has one row in <schema>.cursors that holds
// both the group's cursor and the partition's lease: owner, fencing token
// (incremented on every acquisition) and expiry, all on the server's clock.
// A [Manager] keeps its member's heartbeat in <schema>.members, acquires
// free or expired leases up to its share of the partitions, renews them,
// gives surplus ones back when members join, and hands each acquired
// [Lease] to the caller, who runs one worker per lease.
//
// A lease is never taken from a live owner: a partition changes hands only
// after its owner released it (which it does only once the worker called
// [Lease.Done]) or after the lease expired. Cursor writes ([Lease.Advance],
// [Lease.RecordFailure]) check owner, token and expiry in the same UPDATE,
// so a stalled worker whose lease was taken over cannot move the new
// owner's cursor: it gets [ErrLeaseLost].
//
// Shares are deterministic: the live members sorted by id, the first
// (active mod members) of them get one partition more, where active is the
// number of partitions that are not paused. They add up to the number of
// active partitions, so the split converges to an even one.
package lease
