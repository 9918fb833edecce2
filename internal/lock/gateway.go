package lock

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
)

// Gateway serves the lock service's operator calls at an address that is not
// a node (the `grove up` gateway): List goes to the master, Hold to the first
// node in Nodes that accepts it.
type Gateway struct {
	pb.UnimplementedLockServiceServer
	Meta  *meta.Client
	Nodes []string // gRPC addresses, in order of preference
	conns connCache
}

// Close drops the gateway's connections.
func (g *Gateway) Close() { g.conns.close() }

func (g *Gateway) List(ctx context.Context, _ *pb.ListRequest) (*pb.ListResponse, error) {
	return ListFromMaster(ctx, g.Meta, &g.conns, "")
}

func (g *Gateway) Hold(req *pb.HoldRequest, stream grpc.ServerStreamingServer[pb.HoldResponse]) error {
	var last error = errors.New("no nodes")
	for _, addr := range g.Nodes {
		cl, err := g.conns.get(addr)
		if err != nil {
			last = err
			continue
		}
		up, err := cl.Hold(stream.Context(), req)
		if err != nil {
			last = err
			continue
		}
		first, err := up.Recv()
		if err != nil {
			if s, ok := status.FromError(err); ok && s.Code() == codes.InvalidArgument {
				return err
			}
			last = err
			continue // that node cannot serve: try the next
		}
		if err := stream.Send(first); err != nil {
			return err
		}
		for {
			ev, err := up.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
	return status.Errorf(codes.Unavailable, "lock: no node could take the hold (last: %s)", transport.Describe(last))
}
