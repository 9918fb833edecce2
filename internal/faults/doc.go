// Package faults is the multi-host fault suite: real `grove server`
// processes, each in its own network namespace, a client in another, all
// joined by a bridge in a namespace of its own, and faults made with
// nftables (isolations, one-way cuts, random loss), SIGSTOP, and noise
// (garbage and forged failure-detector datagrams) from the client.
//
// Each scenario checks safety, as hard failures: never two valid holders of
// an exclusive lock, no lost decree, no dead verdict before the node's
// self-fence. It measures, against the targets, the time from the fault to
// the self-fence, the verdict, the lock's failover and a new config leader,
// and from the heal to the node being back; loss runs count false
// self-fences per node-minute. Then the B-link tree's scenario (tree.go)
// runs the real-process linearizability workload (internal/btree/linload)
// from the client's namespace under network faults: isolations, cuts
// between two nodes only, one-way cuts, loss. TestFaults runs it all when
// GROVE_FAULTS is set (scripts/faults.sh).
package faults
