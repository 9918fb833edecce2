package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/fd"
	"github.com/grovestore/grove/internal/lock"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
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
	mu        struct {
		sync.Mutex
		lastLeader uint64 // the last leader a status saw (reported while there is none)
	}
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

// Bounds of one status query. A cluster without quorum must still get an
// answer quickly (what answers, what does not, the last known leader), so
// the linearizable read of the node list is bounded well inside the CLI's
// default --command-timeout, and members are probed directly in parallel.
const (
	StatusReadTimeout  = 2 * time.Second
	MemberProbeTimeout = time.Second
	StatusTableGrace   = 200 * time.Millisecond
)

func (s *StatusService) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out := &pb.StatusResponse{}
	probes := make(chan []*pb.MemberHealth, 1)
	views := make(chan []*pb.MembersResponse, 1)
	go func() {
		h, v := s.probeMembers(ctx)
		probes <- h
		views <- v
	}()
	rctx, rcancel := context.WithTimeout(ctx, StatusReadTimeout)
	// The RLDev table (which nodes were forgotten) is read beside the node
	// list, under the same deadline, and waited for at most
	// StatusTableGrace once the node list is here (then its last copy
	// serves): it only says which dead nodes are no problem, and a status
	// must not take longer for it (outside review 96).
	tables := make(chan *pb.Namespace, 1)
	go func() {
		t, _ := s.client.Read(rctx, rldev.Namespace)
		tables <- t
	}()
	ns, err := s.client.Read(rctx, meta.NodesNamespace)
	var table *pb.Namespace
	select {
	case table = <-tables:
	case <-time.After(StatusTableGrace):
	}
	rcancel()
	if err != nil {
		// Report what can be known: the last copy read, marked stale.
		out.Stale, out.ConfigError = true, fmt.Sprintf("no config-service leader answered within %v (%s)", StatusReadTimeout, transport.Describe(err))
		ns = s.client.Hint(meta.NodesNamespace)
	}
	var nodes []*pb.Node
	if ns != nil {
		if nodes, err = meta.DecodeNodes(ns); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	out.MemberHealth = <-probes
	view := bestView(<-views)
	if view != nil {
		out.Leader, out.Members = view.LeaderId, view.Members
	} else {
		// Nobody answered: the configured members, so that the operator
		// sees which ones were asked.
		for _, m := range s.observers {
			out.Members = append(out.Members, &pb.Member{Id: m.ID, RaftAddr: m.Raft, GrpcAddr: m.GRPC, Voter: true})
		}
	}
	s.mu.Lock()
	if out.Stale && out.Leader != 0 {
		// A member still calls itself leader, but no linearizable read
		// went through: it has lost its majority and not yet noticed
		// (it steps down within its leader lease). It is the last leader,
		// not a leader that serves.
		s.mu.lastLeader, out.Leader = out.Leader, 0
	}
	if out.Leader != 0 {
		s.mu.lastLeader = out.Leader
	} else {
		out.LastLeader = s.mu.lastLeader
	}
	s.mu.Unlock()
	forgotten := s.forgotten(table)
	dead, heard, answered := s.Query(ctx, nodes)
	for i, n := range nodes {
		out.Nodes = append(out.Nodes, &pb.NodeStatus{
			Id: n.Id, Incarnation: n.Incarnation, Roles: n.Roles, GrpcAddr: n.GrpcAddr, BeaconAddr: n.BeaconAddr,
			Alive: !fd.CombineVerdicts(dead[i], len(s.observers)), ObserversAnswered: uint32(answered), ObserversDead: uint32(dead[i]),
			ObserversHeard: uint32(heard[i]), Forgotten: forgotten != nil && forgotten.Forgotten(n.Id),
		})
	}
	return out, nil
}

// forgotten decodes the RLDev table, which says which nodes were
// forgotten whole (grove rldev forget-node, rldev.Table.Forgotten): ns as
// read, or, if the read failed, the last copy read. nil if there is none
// or it does not decode: no node is then reported forgotten (each is
// reported dead, a problem, as before it was forgotten).
func (s *StatusService) forgotten(ns *pb.Namespace) *rldev.Table {
	if ns == nil {
		ns = s.client.Hint(rldev.Namespace)
	}
	if ns == nil {
		return nil
	}
	t, err := rldev.DecodeTable(ns)
	if err != nil {
		return nil
	}
	return t
}

// probeMembers asks every configured member for its own view, in parallel,
// in member order. Like Query it does not wait for stragglers: once a
// majority answered, a member silent ObserverStraggler later is reported
// as not answering (a member cut off silently would otherwise cost every
// status the whole MemberProbeTimeout).
func (s *StatusService) probeMembers(ctx context.Context) ([]*pb.MemberHealth, []*pb.MembersResponse) {
	ctx, cancel := context.WithTimeout(ctx, MemberProbeTimeout)
	defer cancel()
	health := make([]*pb.MemberHealth, len(s.observers))
	views := make([]*pb.MembersResponse, len(s.observers))
	var mu sync.Mutex
	answered, majority := 0, len(s.observers)/2+1
	var wg sync.WaitGroup
	for i, m := range s.observers {
		health[i] = &pb.MemberHealth{Id: m.ID}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cc, err := s.conns.Get(m.GRPC)
			var r *pb.MembersResponse
			if err == nil {
				r, err = pb.NewConfigServiceClient(cc).Members(ctx, &pb.MembersRequest{})
			}
			mu.Lock()
			defer mu.Unlock()
			h := health[i]
			if err != nil {
				h.Error = transport.Describe(err)
				return
			}
			views[i] = r
			h.Answered, h.RaftState, h.Leader, h.Term, h.CommitIndex, h.LastContactMs = true, r.RaftState, r.LeaderId, r.Term, r.CommitIndex, r.LastContactMs
			answered++
			if answered == majority && answered < len(s.observers) {
				time.AfterFunc(ObserverStraggler, cancel)
			}
		}()
	}
	wg.Wait()
	return health, views
}

// bestView picks the members' view to report: a leader's own (the highest
// term, if an isolated old leader still answers), else the answer with the
// highest term and commit index.
func bestView(vs []*pb.MembersResponse) *pb.MembersResponse {
	var best *pb.MembersResponse
	better := func(a, b *pb.MembersResponse) bool {
		al, bl := a.RaftState == "leader", b.RaftState == "leader"
		if al != bl {
			return al
		}
		if a.Term != b.Term {
			return a.Term > b.Term
		}
		return a.CommitIndex > b.CommitIndex
	}
	for _, v := range vs {
		if v != nil && (best == nil || better(v, best)) {
			best = v
		}
	}
	return best
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
