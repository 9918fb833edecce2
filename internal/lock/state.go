package lock

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Namespace is the lock service's namespace in the config service:
//
//	master            LockMasterRecord: who is master, in which epoch
//	clerk/<id>        LockClerkRecord: the clerk list
//	recovery/<id>     LockRecoveryRecord: pending recovery obligations
const Namespace = "lock"

// MasterRecord names the master of an epoch.
type MasterRecord struct {
	Node  uint64
	Inc   uint64
	Epoch Epoch
	Addr  string // its gRPC address
}

// State is the lock namespace decoded.
type State struct {
	Version uint64
	Master  *MasterRecord // nil before the first takeover
	Clerks  []ClerkInfo   // in id order
	Records []RecoveryRecord
}

// hasClerk reports whether the namespace lists clerk id.
func (s *State) hasClerk(id ClerkID) bool {
	i := sort.Search(len(s.Clerks), func(i int) bool { return !s.Clerks[i].ID.Less(id) })
	return i < len(s.Clerks) && s.Clerks[i].ID == id
}

func clerkKey(id ClerkID) string    { return "clerk/" + id.String() }
func recoveryKey(id ClerkID) string { return "recovery/" + id.String() }

// DecodeState decodes the lock namespace.
func DecodeState(ns *pb.Namespace) (*State, error) {
	st := &State{Version: ns.GetVersion()}
	for _, e := range ns.GetEntries() {
		switch {
		case e.Key == "master":
			m := &pb.LockMasterRecord{}
			if err := proto.Unmarshal(e.Value, m); err != nil {
				return nil, fmt.Errorf("lock: master record: %w", err)
			}
			st.Master = &MasterRecord{Node: m.Node, Inc: m.Incarnation, Epoch: Epoch(m.Epoch), Addr: m.GrpcAddr}
		case strings.HasPrefix(e.Key, "clerk/"):
			r := &pb.LockClerkRecord{}
			if err := proto.Unmarshal(e.Value, r); err != nil {
				return nil, fmt.Errorf("lock: clerk record %s: %w", e.Key, err)
			}
			id, err := ClerkIDFromPB(r.Id)
			if err != nil {
				return nil, err
			}
			st.Clerks = append(st.Clerks, ClerkInfo{ID: id, Kind: r.Kind, Scope: r.Scope})
		case strings.HasPrefix(e.Key, "recovery/"):
			r := &pb.LockRecoveryRecord{}
			if err := proto.Unmarshal(e.Value, r); err != nil {
				return nil, fmt.Errorf("lock: recovery record %s: %w", e.Key, err)
			}
			id, err := ClerkIDFromPB(r.Dead)
			if err != nil {
				return nil, err
			}
			rec := RecoveryRecord{Dead: id, Kind: r.Kind, All: r.All, Held: map[string]Mode{}, Scope: r.Scope, Started: r.Started}
			for _, n := range r.Names { // older records: names only, taken as exclusive
				rec.Held[string(n)] = Exclusive
			}
			for _, l := range r.Leases {
				md, err := modeFromPB(l.Mode, false)
				if err != nil {
					return nil, fmt.Errorf("lock: recovery record %s: %w", e.Key, err)
				}
				rec.Held[string(l.Name)] = md
			}
			st.Records = append(st.Records, rec)
		}
	}
	sort.Slice(st.Clerks, func(i, j int) bool { return st.Clerks[i].ID.Less(st.Clerks[j].ID) })
	sort.Slice(st.Records, func(i, j int) bool { return st.Records[i].Dead.Less(st.Records[j].Dead) })
	return st, nil
}

func put(key string, m proto.Message) *pb.Op {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return &pb.Op{Kind: pb.Op_KIND_PUT, Key: key, Value: b}
}

func del(key string) *pb.Op { return &pb.Op{Kind: pb.Op_KIND_DELETE, Key: key} }

func has(ns *pb.Namespace, key string) bool {
	for _, e := range ns.GetEntries() {
		if e.Key == key {
			return true
		}
	}
	return false
}

// errSuperseded: a decree of a master whose epoch is over.
var errSuperseded = errors.New("lock: superseded by a newer master")

// registerClerkOps adds a clerk to the clerk list (if it is not there yet).
func registerClerkOps(ns *pb.Namespace, ci ClerkInfo) ([]*pb.Op, error) {
	if has(ns, clerkKey(ci.ID)) {
		return nil, nil
	}
	return []*pb.Op{put(clerkKey(ci.ID), &pb.LockClerkRecord{Id: ClerkIDToPB(ci.ID), Kind: ci.Kind, Scope: ci.Scope})}, nil
}

// takeoverDecree makes rec master, conditional on the version read (whose
// master record the standby found dead, or absent, or its own halted one).
func takeoverDecree(version uint64, rec MasterRecord) *pb.Decree {
	return &pb.Decree{Namespace: Namespace, ExpectedVersion: version, Origin: "lock-standby",
		Ops: []*pb.Op{put("master", &pb.LockMasterRecord{Node: rec.Node, Incarnation: rec.Inc, Epoch: uint64(rec.Epoch), GrpcAddr: rec.Addr})}}
}

// masterOps builds a master's decree, only while it is still the master.
func masterOps(ns *pb.Namespace, epoch Epoch, ops func() []*pb.Op) ([]*pb.Op, error) {
	st, err := DecodeState(ns)
	if err != nil {
		return nil, err
	}
	if st.Master == nil || st.Master.Epoch != epoch {
		return nil, errSuperseded
	}
	return ops(), nil
}

// persistOps records a recovery obligation.
func persistOps(ns *pb.Namespace, epoch Epoch, r RecoveryRecord) ([]*pb.Op, error) {
	return masterOps(ns, epoch, func() []*pb.Op {
		rec := &pb.LockRecoveryRecord{Dead: ClerkIDToPB(r.Dead), Kind: r.Kind, All: r.All, Scope: r.Scope, Started: r.Started}
		for _, n := range r.Names() {
			rec.Leases = append(rec.Leases, &pb.HeldLease{Name: []byte(n), Mode: modeToPB(r.Held[n])})
		}
		return []*pb.Op{put(recoveryKey(r.Dead), rec)}
	})
}

// forgetOps removes a dead clerk's clerk record and recovery record in one
// decree (the recovery ordering rule: see Forget).
func forgetOps(ns *pb.Namespace, epoch Epoch, dead ClerkID) ([]*pb.Op, error) {
	return masterOps(ns, epoch, func() []*pb.Op {
		var ops []*pb.Op
		for _, k := range []string{clerkKey(dead), recoveryKey(dead)} {
			if has(ns, k) {
				ops = append(ops, del(k))
			}
		}
		return ops
	})
}
