package node

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
)

// review96Fake is one config-service member (leader) and observer in one
// gRPC server: it answers reads of the namespaces it holds (the RLDev
// namespace after rldevDelay, or never if rldevHang), and every observer
// query with dead[node].
type review96Fake struct {
	pb.UnimplementedConfigServiceServer
	pb.UnimplementedObserverServiceServer
	mu         sync.Mutex
	ns         map[string]*pb.Namespace
	dead       map[uint64]bool
	rldevHang  bool
	rldevReads int
}

func (f *review96Fake) Read(ctx context.Context, r *pb.ReadRequest) (*pb.ReadResponse, error) {
	f.mu.Lock()
	hang := f.rldevHang && r.Namespace == rldev.Namespace
	if r.Namespace == rldev.Namespace {
		f.rldevReads++
	}
	ns := f.ns[r.Namespace]
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if ns == nil {
		ns = &pb.Namespace{Name: r.Namespace}
	}
	return &pb.ReadResponse{LeaderId: 1, Namespace: ns}, nil
}

func (f *review96Fake) Members(context.Context, *pb.MembersRequest) (*pb.MembersResponse, error) {
	return &pb.MembersResponse{LeaderId: 1, Term: 1, RaftState: "leader"}, nil
}

func (f *review96Fake) Query(_ context.Context, r *pb.QueryRequest) (*pb.QueryResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &pb.QueryResponse{Observer: 1}
	for _, s := range r.Subjects {
		out.Dead = append(out.Dead, f.dead[s.Node])
		out.Heard = append(out.Heard, !f.dead[s.Node])
	}
	return out, nil
}

func review96Start(t *testing.T, f *review96Fake) *StatusService {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterConfigServiceServer(gs, f)
	pb.RegisterObserverServiceServer(gs, f)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	addr := lis.Addr().String()
	c := meta.NewClient([]meta.Member{{ID: 1, GRPCAddr: addr}})
	t.Cleanup(c.Close)
	s := NewStatusService(c, []MemberConfig{{ID: 1, GRPC: addr}})
	t.Cleanup(s.Close)
	return s
}

func review96Nodes(t *testing.T, ids ...uint64) *pb.Namespace {
	ns := &pb.Namespace{Name: meta.NodesNamespace, Version: 1}
	for _, id := range ids {
		b, err := proto.Marshal(&pb.Node{Id: id, Incarnation: 1, Roles: []string{"store"}})
		if err != nil {
			t.Fatal(err)
		}
		ns.Entries = append(ns.Entries, &pb.Entry{Key: meta.NodeKey(id), Value: b})
	}
	return ns
}

func review96Table(ops ...*pb.Op) *pb.Namespace {
	ns := &pb.Namespace{Name: rldev.Namespace, Version: 7}
	for _, op := range ops {
		ns.Entries = append(ns.Entries, &pb.Entry{Key: op.Key, Value: op.Value})
	}
	return ns
}

func review96Node(t *testing.T, r *pb.StatusResponse, id uint64) *pb.NodeStatus {
	t.Helper()
	for _, n := range r.Nodes {
		if n.Id == id {
			return n
		}
	}
	t.Fatalf("node %d not in the status: %v", id, r)
	return nil
}

// The state `grove rldev forget-node 3 --re-place --gone-for-good` leaves
// when it stops after its first decree (interrupted, timed out, a
// conflicting decree: the README's "a command stopped half-way"): node 3's
// disks are all forgotten (ForgetDisks), but RLDev 1 still has its
// secondary there, degraded on one copy, nothing re-placed yet. Status
// reports node 3 forgotten (health: "not a problem", exit 0) although the
// evacuation is unfinished and the node still holds a segment: before
// 398a36f the dead node was a problem until forget-node finished.
func TestReview96HalfWayReplaceShownForgotten(t *testing.T) {
	rec := &rldev.Record{ID: 1, Blocks: 256, Primary: 0, State: rldev.Degraded, Stale: [2]bool{false, true}, Epoch: 3,
		Segs: [2]rldev.Segment{{Node: 1, Disk: 0, Offset: rldev.DiskReserved}, {Node: 3, Disk: 0, Offset: rldev.DiskReserved}}}
	f := &review96Fake{dead: map[uint64]bool{3: true}, ns: map[string]*pb.Namespace{
		meta.NodesNamespace: review96Nodes(t, 1, 3),
		rldev.Namespace: review96Table(
			rldev.PutDiskOp(&rldev.Disk{Node: 1, Index: 0, Size: 1 << 30, UUID: "a"}),
			rldev.PutDiskOp(&rldev.Disk{Node: 3, Index: 0, Size: 1 << 30, UUID: "b", Forgotten: true}),
			rec.PutOp()),
	}}
	s := review96Start(t, f)
	r, err := s.Status(context.Background(), &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := review96Node(t, r, 3)
	if n.Alive {
		t.Fatalf("setup: node 3 alive: %v", n)
	}
	if n.Forgotten {
		t.Fatalf("node 3 still holds rldev 1's secondary (forget-node --re-place stopped after its first decree), yet status reports it forgotten (no problem): %v", n)
	}
}

// The RLDev table read is a second linearizable read, after the node
// list's, each bounded by its own StatusReadTimeout: a config service that
// answered the node list but not (yet) the table read now costs status
// 2 s more than before 398a36f, only to learn a display flag; a status
// answered in milliseconds takes more than 2 s (grove health's own
// example, --command-timeout 3s, and GatewayNodes' 2 s bound on the
// gateway's Status are then close or past).
func TestReview96SlowTableReadDelaysStatus(t *testing.T) {
	f := &review96Fake{dead: map[uint64]bool{}, rldevHang: true, ns: map[string]*pb.Namespace{
		meta.NodesNamespace: review96Nodes(t, 1, 3),
	}}
	s := review96Start(t, f)
	start := time.Now()
	r, err := s.Status(context.Background(), &pb.StatusRequest{})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if r.Stale {
		t.Fatalf("setup: the node list read failed: %v", r)
	}
	if took > time.Second {
		t.Fatalf("status took %v (the node list was read at once; the RLDev table read alone held it for StatusReadTimeout)", took.Round(10*time.Millisecond))
	}
}
