package meta

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// AddressBook is the nodes' gRPC addresses, kept current by a watch on
// the membership (not polled): what a clerk or a node dials its peers by.
type AddressBook struct {
	stop context.CancelFunc
	done chan struct{}
	mu   sync.Mutex
	// addrs by node id; changed is closed (and replaced) at every update.
	addrs    map[uint64]string
	features map[uint64][]string // what each node's build speaks (pb.Node.Features)
	changed  chan struct{}
}

// NewAddressBook starts watching the membership through c (which it does
// not close); Close stops it.
func NewAddressBook(c *Client) *AddressBook {
	ctx, stop := context.WithCancel(context.Background())
	b := &AddressBook{stop: stop, done: make(chan struct{}), addrs: map[uint64]string{}, changed: make(chan struct{})}
	go func() {
		defer close(b.done)
		for ns := range c.Watch(ctx, NodesNamespace, 0) {
			nodes, err := DecodeNodes(ns)
			if err != nil {
				continue // membership is written only by RegisterNode; the next version will do
			}
			addrs, features := map[uint64]string{}, map[uint64][]string{}
			for _, n := range nodes {
				addrs[n.Id] = n.GrpcAddr
				features[n.Id] = n.Features
			}
			b.mu.Lock()
			b.addrs, b.features = addrs, features
			close(b.changed)
			b.changed = make(chan struct{})
			b.mu.Unlock()
		}
	}()
	return b
}

// Close stops the watch.
func (b *AddressBook) Close() {
	b.stop()
	<-b.done
}

// Lookup is node's address as last seen ("" if unknown).
func (b *AddressBook) Lookup(node uint64) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.addrs[node]
}

// Has reports whether node's record, as last seen, names feature (what
// its build speaks beyond what every build does: pb.Node.Features).
func (b *AddressBook) Has(node uint64, feature string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Contains(b.features[node], feature)
}

// All reports whether every node's record, as last seen, names feature,
// and at least one was seen (false before the watch's first answer).
func (b *AddressBook) All(feature string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.addrs) == 0 {
		return false
	}
	for id := range b.addrs {
		if !slices.Contains(b.features[id], feature) {
			return false
		}
	}
	return true
}

// Nodes returns every node's address as last seen (a copy).
func (b *AddressBook) Nodes() map[uint64]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[uint64]string, len(b.addrs))
	for id, a := range b.addrs {
		out[id] = a
	}
	return out
}

// View returns every node's address as last seen, without a copy (the map
// is shared: read it, never change it; an update replaces it), and a
// channel closed at the next update: what a caller may derive from the
// map holds until then.
func (b *AddressBook) View() (map[uint64]string, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.addrs, b.changed
}

// Addr is node's address, waiting up to 2 s for the membership to name it
// (a clerk just started, a node just registered).
func (b *AddressBook) Addr(ctx context.Context, node uint64) (string, error) {
	timeout := time.After(2 * time.Second)
	for {
		b.mu.Lock()
		a, ch := b.addrs[node], b.changed
		b.mu.Unlock()
		if a != "" {
			return a, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return "", fmt.Errorf("the address of node %d: %w", node, ctx.Err())
		case <-timeout:
			return "", fmt.Errorf("node %d is not in the membership", node)
		}
	}
}
