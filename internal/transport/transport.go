// Package transport is how Grove processes reach each other: a pool of gRPC
// client connections, one per address, shared by the layers of a process.
// (Listening stays with the node; the simulator replaces this layer with its
// own sessions and datagrams.)
package transport

import (
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Pool keeps one client connection per address. Safe for concurrent use.
// The zero value is ready to use.
type Pool struct {
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// Get returns the connection to addr, creating it on first use. gRPC
// connects lazily and reconnects by itself, so a cached connection to a node
// that restarted keeps working.
func (p *Pool) Get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[addr]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	if p.conns == nil {
		p.conns = map[string]*grpc.ClientConn{}
	}
	p.conns[addr] = c
	return c, nil
}

// Close closes every connection; the pool may be used again afterwards.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
