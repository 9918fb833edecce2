package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"

	pb "github.com/grovestore/grove/api/grovepb"
)

// RemoteHeld is a lock held through a node's clerk over gRPC (the node's
// LockService.Hold stream): how a process that is not a node (a client
// of the Go API, a test) holds a lock. The lease is the node's: it ends
// when the node's incarnation loses its leases, when the stream breaks
// (nothing vouches for the lease then; the lock service frees it once
// the node is declared dead, or at once if the node saw the stream end),
// or at Release. Lost is closed in each case. A holder must fence its
// writes with Token: it learns of a loss only after the fact.
type RemoteHeld struct {
	token  Token
	cancel context.CancelFunc
	lost   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	reason error
}

// HoldRemote asks the node at conn to acquire name in mode for this
// process and returns once it is granted (or ctx ends: the request is
// then withdrawn). fresh: the node gives back a lease it caches for the
// lock first, so that the grant's token is newer than every earlier one.
func HoldRemote(ctx context.Context, conn grpc.ClientConnInterface, name string, mode Mode, fresh bool) (*RemoteHeld, error) {
	m := pb.LockMode_LOCK_MODE_SHARED
	if mode == Exclusive {
		m = pb.LockMode_LOCK_MODE_EXCLUSIVE
	}
	// The stream outlives ctx (which bounds the wait for the grant only).
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	stream, err := pb.NewLockServiceClient(conn).Hold(sctx, &pb.HoldRequest{Name: []byte(name), Mode: m, Fresh: fresh})
	var first *pb.HoldResponse
	if err == nil {
		first, err = stream.Recv()
	}
	if !stop() || err != nil || first.Kind != pb.HoldResponse_KIND_GRANTED {
		cancel()
		if err == nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			} else {
				err = fmt.Errorf("lock: %q: the node answered %v before a grant", name, first.Kind)
			}
		}
		return nil, err
	}
	h := &RemoteHeld{token: TokenFromPB(first.Token), cancel: cancel, lost: make(chan struct{})}
	go func() {
		for {
			ev, err := stream.Recv()
			if err == nil && ev.Kind != pb.HoldResponse_KIND_RELEASED {
				continue
			}
			if err == nil {
				err = errors.New("released")
			}
			h.lose(fmt.Errorf("lock: the hold on %q ended: %w", name, err))
			return
		}
	}()
	return h, nil
}

func (h *RemoteHeld) lose(err error) {
	h.once.Do(func() {
		h.mu.Lock()
		h.reason = err
		h.mu.Unlock()
		close(h.lost)
	})
}

// Token is the grant's fencing token.
func (h *RemoteHeld) Token() Token { return h.token }

// Lost is closed once the hold has ended, whatever the cause.
func (h *RemoteHeld) Lost() <-chan struct{} { return h.lost }

// LostReason says why (nil before Lost is closed).
func (h *RemoteHeld) LostReason() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reason
}

// Release gives the lock up (the node releases the lease).
func (h *RemoteHeld) Release() {
	h.lose(errors.New("lock: released"))
	h.cancel()
}
