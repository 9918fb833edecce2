package node

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/transport"
)

// serveDeciding answers on the node's port while a member without raft
// state decides what --bootstrap-if-new makes of it (clusterIsNew): the
// other members' probes (MembersRequest.vouch_for) get "no raft state",
// so that members of a new cluster, each deciding, hear each other and
// bootstrap once all have answered. Every other call is refused as
// Unavailable, saying why: a deciding member has no configuration to give
// (`grove member add` must not take it for a member waiting to be added,
// nor `grove status` for a member with an empty one). Stop hands the port
// to the node's real server (transport.Guarded.View).
func serveDeciding(g *transport.Guarded, id uint64) *grpc.Server {
	refuse := status.Errorf(codes.Unavailable, "node %d has no raft state and is deciding whether to bootstrap (--bootstrap-if-new): it waits for every member to answer", id)
	members := pb.ConfigService_Members_FullMethodName
	s := grpc.NewServer(append(transport.ServerOptions(),
		grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error { return refuse }),
		// The config service's other methods too (the embedded
		// Unimplemented* would say Unimplemented, which reads as "never").
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if info.FullMethod != members {
				return nil, refuse
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(any, grpc.ServerStream, *grpc.StreamServerInfo, grpc.StreamHandler) error { return refuse }))...)
	pb.RegisterConfigServiceServer(s, decidingService{refuse: refuse})
	go s.Serve(g.View())
	return s
}

// decidingService is serveDeciding's config service.
type decidingService struct {
	pb.UnimplementedConfigServiceServer
	refuse error
}

// Members answers a probe with no configuration, commit index or record
// of counted peers: what the member has.
func (d decidingService) Members(_ context.Context, req *pb.MembersRequest) (*pb.MembersResponse, error) {
	if req.GetVouchFor() == 0 || req.GetConfirmed() {
		return nil, d.refuse
	}
	return &pb.MembersResponse{RaftState: "deciding"}, nil
}
