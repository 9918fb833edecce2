package meta

import (
	"bytes"
	"io"
	"log/slog"
	"testing"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"
)

// snapshotBytes is the FSM's snapshot as raft would persist it.
func snapshotBytes(t *testing.T, f *FSM) []byte {
	s, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return []byte(s.(snapshot))
}

// FuzzRestoreSnapshot: a config-service replica restores its state from a
// snapshot on its disk or sent by the leader. Whatever the bytes, Restore
// never panics; a snapshot it accepts is taken again as it was (a replica
// that restores and snapshots passes the same state on), and decrees
// apply on top of it.
func FuzzRestoreSnapshot(f *testing.F) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	seed := NewFSM(quiet)
	for i, d := range []*pb.Decree{put("nodes", 0, "1", "x"), put("nodes", 1, "2", "y"), put("lock", 0, "master", "m")} {
		d.Id = []byte{byte(i + 1)}
		b, _ := proto.Marshal(d)
		seed.Apply(&raft.Log{Type: raft.LogCommand, Data: b})
	}
	s, _ := seed.Snapshot()
	f.Add([]byte(s.(snapshot)))
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x03, 0x0a, 0x01, 'n'})
	f.Fuzz(func(t *testing.T, b []byte) {
		fsm := NewFSM(quiet)
		if err := fsm.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
			return
		}
		first := snapshotBytes(t, fsm)
		again := NewFSM(quiet)
		if err := again.Restore(io.NopCloser(bytes.NewReader(first))); err != nil {
			t.Fatalf("a snapshot of a restored state does not restore: %v", err)
		}
		if second := snapshotBytes(t, again); !bytes.Equal(first, second) {
			t.Fatal("restored twice, the state differs")
		}
		for _, name := range []string{"nodes", "lock"} {
			d := put(name, fsm.Version(name), "k", "v")
			d.Id = []byte("fuzz")
			seen := false
			if ns := fsm.mu.ns[name]; ns != nil {
				for _, id := range ns.ids {
					seen = seen || bytes.Equal(id, d.Id)
				}
			}
			db, _ := proto.Marshal(d)
			fsm.Apply(&raft.Log{Type: raft.LogCommand, Data: db})
			if !seen && fsm.Version(name) != d.ExpectedVersion+1 {
				t.Fatalf("a decree at %q's version did not apply on the restored state", name)
			}
		}
	})
}

// FuzzDecodeNodes: the membership namespace, as a watch delivers it. A
// record that does not decode is an error, never a panic; what decodes
// comes out in id order.
func FuzzDecodeNodes(f *testing.F) {
	n1, _ := proto.Marshal(&pb.Node{Id: 1, Incarnation: 3, GrpcAddr: "127.0.0.1:1"})
	n2, _ := proto.Marshal(&pb.Node{Id: 2, Incarnation: 1})
	ns, _ := proto.Marshal(&pb.Namespace{Name: "nodes", Version: 2, Entries: []*pb.Entry{{Key: "1", Value: n1}, {Key: "2", Value: n2}}})
	f.Add(ns)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		ns := &pb.Namespace{}
		if proto.Unmarshal(b, ns) != nil {
			return
		}
		nodes, err := DecodeNodes(ns)
		if err != nil {
			return
		}
		for i := 1; i < len(nodes); i++ {
			if nodes[i].Id < nodes[i-1].Id {
				t.Fatalf("nodes out of id order: %d before %d", nodes[i-1].Id, nodes[i].Id)
			}
		}
	})
}
