package rldev

import (
	"context"
	"sync"
)

// Review 41's hooks.

// ClerkHasTable reports whether c holds a table (its watch delivered one,
// if nothing called Table).
func ClerkHasTable(c *Clerk) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.table != nil
}

// ClerkLookup is node's address in c's address book, as last seen.
func ClerkLookup(c *Clerk, node uint64) string { return c.book.Lookup(node) }

// ClerkHas is c.book.Has(node, FeatureSeqConns).
func ClerkHas(c *Clerk, node uint64) bool { return c.book.Has(node, FeatureSeqConns) }

// LagClerkTable makes c's cached table t as it was one version before,
// with RLDev id's primary the other segment: the clerk's view lags a
// failover (from that segment's node to the primary t names). A fresh
// read (every retry) replaces it.
func LagClerkTable(c *Clerk, t *Table, id uint64) {
	old := &Table{Version: t.Version - 1, RLDevs: map[uint64]*Record{}, Disks: t.Disks}
	for k, r := range t.RLDevs {
		old.RLDevs[k] = r.Clone()
	}
	old.RLDevs[id].Primary = 1 - old.RLDevs[id].Primary
	c.mu.Lock()
	c.mu.table = old
	c.mu.Unlock()
}

// TestPool is a clerk's data-path connection pool (dataConns) on its own.
type TestPool struct{ p dataConns }

// TestConn is one of its connections.
type TestConn struct{ d *dataConn }

func (c TestConn) Broken() bool    { return c.d.broken() }
func (c TestConn) Sequenced() bool { return c.d.sequenced }
func (c TestConn) Same(o TestConn) bool {
	return c.d == o.d
}

// Get is dataConns.get.
func (tp *TestPool) Get(ctx context.Context, addr string, sequenced bool) (TestConn, error) {
	d, err := tp.p.get(ctx, addr, sequenced)
	return TestConn{d}, err
}

// Current is the pool's connection to addr (ok false if none).
func (tp *TestPool) Current(addr string) (TestConn, bool) {
	tp.p.mu.Lock()
	defer tp.p.mu.Unlock()
	d := tp.p.conns[addr]
	return TestConn{d}, d != nil
}

// HoldDials takes addr's dial lock (as a dial in progress holds it)
// until release is called.
func (tp *TestPool) HoldDials(addr string) (release func()) {
	tp.p.mu.Lock()
	if tp.p.dials == nil {
		tp.p.conns, tp.p.dials = map[string]*dataConn{}, map[string]*sync.Mutex{}
		tp.p.clerk = 1
	}
	dl := tp.p.dials[addr]
	if dl == nil {
		dl = &sync.Mutex{}
		tp.p.dials[addr] = dl
	}
	tp.p.mu.Unlock()
	dl.Lock()
	return dl.Unlock
}

// Close is dataConns.close (what Clerk.Close does).
func (tp *TestPool) Close() { tp.p.close() }
