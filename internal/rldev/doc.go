// Package rldev is Boxwood's replicated logical device (§3.4): a fixed-size
// block device made of two equal segments on the disks of two different
// nodes, placed by chained declustering, which the layers above (chunk
// manager, transaction log, B-link trees, BoxFS) trust with their data.
// It adds replication, placement and failover to the local disks of
// internal/disk.
//
// # Geometry and configuration
//
// An RLDev is Blocks logical blocks of BlockSize (4 KiB); accesses are
// block aligned. Its two segments live on nodes' disks (format.go gives
// the on-disk layout: a metadata area, then blocks with a header carrying
// a CRC, the RLDev id, the block number and a generation). RLDev i of a
// cluster of N storage nodes has its primary on node k = i mod N and its
// secondary on node k+1 mod N, so that every node is primary for some
// RLDevs and secondary for others, and a failed node's load falls on its
// two neighbours. The RLDev table is the config service's namespace
// "rldev": one record per RLDev (segments, which one is primary, the
// state, which segment is stale, the epoch, resync progress, a move
// target) and one per disk. Every change of a record is a decree,
// conditional on the namespace version read, and bumps the record's epoch
// when it changes who serves.
//
// # Replication (the engine's rules)
//
// Normal state: a client writes to the primary. The primary orders
// overlapping writes (a range lock held from the start of a write to its
// acknowledgement, so that both replicas apply overlapping writes in one
// order), marks the write's regions in its dirty-region log and makes that
// durable, then writes locally and forwards to the secondary at once; it
// acknowledges when both copies are durable. The secondary accepts a
// forward only from the primary of its own epoch. Reads go to either
// replica; a replica does not serve a block while a write to it is in
// progress there (so that what a read returned is durable on the replica
// that served it, and the primary returns a new value only once both
// replicas hold it). Dirty regions (1 MiB) are cleared lazily, in one log
// write per flush (every FlushEvery), once no write is in flight in them
// and none was written since the flush before (a region under steady
// writes keeps its mark rather than pay for it again).
//
// Failure of a replica: the survivor finds its peer unreachable (a broken
// session, a forward or heartbeat unanswered), asks the failure detector,
// and only once the peer's incarnation is declared dead (so the peer has
// fenced itself and serves nothing) passes a decree: state degraded, the
// survivor primary, the peer stale. Before the decree commits, no write is
// acknowledged without the peer. In degraded state the survivor logs every
// region it writes in its degraded-mode log (durable before the write's
// acknowledgement) and serves alone. A partition between the two replicas
// alone, both alive to the observers, loses nothing: writes wait (they fail
// at the client's timeout and complete, or are retried, after the heal);
// reads go on.
//
// The rule behind every transition: a replica that may have missed a write
// never serves a read or accepts a write. It is stale in the table from
// the decree on, and a node reads the table (linearizably) when it starts,
// before it serves anything; a replica removed from an RLDev by a move
// stops serving before the new primary acknowledges anything without it.
//
// Recovery: a stale replica that comes back asks the survivor to resync
// it (decree: resyncing). The survivor forwards new writes to it as well,
// and copies to it, under range locks, the regions of its degraded-mode
// log, then the regions in either replica's dirty-region log (a replica
// that crashed pulls its dirty regions from the one that did not: what a
// replica served is durable on it, so the survivor's content is never
// older than anything a reader saw), or every region after the loss of
// the stale replica's disk. Then a decree returns the RLDev to normal,
// and the degraded-mode log is cleared. A replica that finds its own
// dirty-region log non-empty when it starts (it crashed while primary)
// pulls those regions from its peer before serving them. A stale replica
// whose peer, the only up-to-date copy, is dead waits, visibly.
//
// Retries: a client's write carries a WriteID, the same in each attempt;
// every copy remembers for a while the writes that landed on it, and a
// write whose earlier attempt landed on the primary is not applied again
// there (landed.go): a clerk's retry after a failover does not land over
// a later write of another client, unless that copy forgot the write
// (its engine ended, another copy's blocks landed on it since, the write
// is too old) or its disk lost it; the clerk then counts it applied
// twice (WriteResult.Applied).
//
// Fencing: a write may carry a lock's fencing token; each replica keeps
// the newest token admitted per lock name (durable in the segment's token
// table before a write with a newer token is acknowledged) and refuses
// older ones (lock.TokenGuard's contract).
//
// The engine is a protocol core without I/O (Engine: table updates, client
// requests, peer messages, disk completions, verdicts and ticks in;
// disk operations, messages, decrees and replies out); the driver and the
// simulator both run it.
package rldev
