package meta

import (
	"errors"
	"sync"

	"github.com/hashicorp/raft"
)

// errHeartbeatFenced answers a heartbeat that arrives after Close began.
var errHeartbeatFenced = errors.New("meta: replica is shutting down")

// gatedTransport is the TCP transport with its heartbeat fast path fenced
// by Server.Close.
//
// Why: hashicorp/raft's NetworkTransport runs a heartbeat on the
// connection's goroutine, not raft's (a fast path around disk I/O).
// raft.processHeartbeat checks for shutdown once, at its start; a
// heartbeat that passed that check while Shutdown ran goes on to write the
// term to the stable store and read the log. Shutdown's future waits for
// raft's own goroutines only, so Close then closed the store under it and
// raft panicked ("failed to save current term: closed"; hashicorp/raft
// #717, open; seen once in CI's race run of internal/lock). The gate holds
// each heartbeat under a read lock; fence takes the write lock, so it
// returns only once no heartbeat is running and none will start, and
// only then does Close close the store. A heartbeat handler blocks on
// nothing that Shutdown does not release (raft's channel sends all select
// on its shutdown channel), so fence cannot wait forever.
//
// Embedding the pointer keeps every optional interface raft looks for
// (WithClose, WithPreVote, WithPeers).
type gatedTransport struct {
	*raft.NetworkTransport
	mu     sync.RWMutex
	fenced bool
	// counted, if set, records each peer whose answer raft counts before
	// raft sees it, and each peer this replica answers positively before
	// the answer leaves (counted.go).
	counted *counted
	// For counted's receiving side: the channel raft consumes from (the
	// transport's, forwarded), and done, closed by Close.
	once      sync.Once
	consumeCh chan raft.RPC
	done      chan struct{}
	closeOnce sync.Once // makes done
	shut      sync.Once // closes done
	// forwarded is closed when the forwarding goroutine ends (tests).
	forwarded chan struct{}
}

func (g *gatedTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	if cb == nil {
		g.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	g.NetworkTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		g.mu.RLock()
		defer g.mu.RUnlock()
		if g.fenced {
			rpc.Respond(nil, errHeartbeatFenced)
			return
		}
		cb(g.watchAnswer(rpc))
	})
}

// fence waits for the heartbeats in flight and turns away the rest.
func (g *gatedTransport) fence() {
	g.mu.Lock()
	g.fenced = true
	g.mu.Unlock()
}
