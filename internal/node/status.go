package node

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
)

// StatusService answers `grove status`: membership from a linearizable read
// of the config service, and each node's liveness from the failure-detector
// service (Boxwood Figure 2's query): dead only if a majority of all
// observers say so; an observer that does not answer counts as "alive".
// It runs on every node and in `grove up`'s gateway.
type StatusService struct {
	pb.UnimplementedClusterServiceServer
	client    *meta.Client
	observers []MemberConfig
	conns     transport.Pool
}

// NewStatusService returns a status service over the given config-service
// client and observers.
func NewStatusService(c *meta.Client, observers []MemberConfig) *StatusService {
	return &StatusService{client: c, observers: observers}
}

// ObserverTimeout bounds how long a status query waits for observers;
// once a majority has answered it waits at most ObserverStraggler more for
// the others (an observer cut off silently would otherwise cost every query
// the whole ObserverTimeout, and `grove status` and the lock master's
// suspect polls would slow down exactly when they matter).
const (
	ObserverTimeout   = 500 * time.Millisecond
	ObserverStraggler = 100 * time.Millisecond
)

func (s *StatusService) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ns, err := s.client.Read(ctx, meta.NodesNamespace)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "config service: %v", err)
	}
	nodes, err := meta.DecodeNodes(ns)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	out := &pb.StatusResponse{}
	if m, err := s.client.Members(ctx); err == nil {
		out.Leader, out.Members = m.LeaderId, m.Members
	}
	dead, heard, answered := s.Query(ctx, nodes)
	for i, n := range nodes {
		out.Nodes = append(out.Nodes, &pb.NodeStatus{
			Id: n.Id, Incarnation: n.Incarnation, Roles: n.Roles, GrpcAddr: n.GrpcAddr, BeaconAddr: n.BeaconAddr,
			Alive: !fd.CombineVerdicts(dead[i], len(s.observers)), ObserversAnswered: uint32(answered), ObserversDead: uint32(dead[i]),
			ObserversHeard: uint32(heard[i]),
		})
	}
	return out, nil
}

// Query asks every observer about the registered incarnation of each node
// and returns, per node, how many observers said dead and how many hear it,
// and how many observers answered at all.
func (s *StatusService) Query(ctx context.Context, nodes []*pb.Node) (dead, heard []int, answered int) {
	req := &pb.QueryRequest{}
	for _, n := range nodes {
		req.Subjects = append(req.Subjects, &pb.Subject{Node: n.Id, Incarnation: n.Incarnation})
	}
	dead, heard = make([]int, len(nodes)), make([]int, len(nodes))
	qctx, cancel := context.WithTimeout(ctx, ObserverTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	majority := len(s.observers)/2 + 1
	for _, o := range s.observers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := s.conns.Get(o.GRPC)
			if err != nil {
				return
			}
			r, err := pb.NewObserverServiceClient(cl).Query(qctx, req)
			if err != nil || len(r.Dead) != len(nodes) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			answered++
			for i, d := range r.Dead {
				if d {
					dead[i]++
				}
				if i < len(r.Heard) && r.Heard[i] {
					heard[i]++
				}
			}
			if answered == majority && answered < len(s.observers) {
				time.AfterFunc(ObserverStraggler, cancel)
			}
		}()
	}
	wg.Wait()
	return dead, heard, answered
}

// Dead implements lock.Detector: the failure-detector service's verdict on
// node incarnations (dead only if a majority of observers say so), asked of
// every observer in one batch.
func (s *StatusService) Dead(ctx context.Context, subjects []lock.Subject) ([]bool, error) {
	nodes := make([]*pb.Node, len(subjects))
	for i, x := range subjects {
		nodes[i] = &pb.Node{Id: x.Node, Incarnation: x.Inc}
	}
	dead, _, answered := s.Query(ctx, nodes)
	if answered == 0 {
		return nil, errors.New("no observer answered")
	}
	out := make([]bool, len(subjects))
	for i := range out {
		out[i] = fd.CombineVerdicts(dead[i], len(s.observers))
	}
	return out, nil
}

// Close drops the service's connections.
func (s *StatusService) Close() { s.conns.Close() }
