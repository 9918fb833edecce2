package rldev

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/grovestore/grove/api/grovepb"
)

// Review 99: the clerk's per-incarnation "maybe written" rule (b4d17a1)
// says an attempt answered ErrMaybeWritten by incarnation 1 of the
// primary cannot land after incarnation 2 of that node answered a
// success. The node's own disks are covered by generation.ops; these
// probes check the other place the attempt can land: the secondary,
// through incarnation 1's forward.

// r99Block reads block blk of RLDev id as node n's segment holds it.
func r99Block(h *harness, n *hnode, id, blk uint64) []byte {
	rec := h.rec(id)
	for _, s := range rec.Segs {
		if s.Node != n.id {
			continue
		}
		raw := make([]byte, PhysBlockSize)
		n.devs[s.Disk].ReadAt(raw, s.Offset+MetaSize+int64(blk)*PhysBlockSize)
		d, _, _ := DecodeBlock(raw, id, blk)
		return d
	}
	return nil
}

// r99Fence ends a's engine as a self-fence does (its disks keep what was
// written: the process lives on) and starts its next incarnation at
// once, before any verdict on the past one (the peer cannot degrade).
func r99Fence(h *harness, a *hnode) {
	a.up = false
	for _, p := range h.sorted() {
		if p != a && p.up {
			h.exec(p, p.e.PeerDown(h.env(p), a.id))
		}
	}
	h.run()
	h.start(a)
	h.run()
}

// The forward of incarnation 1 is begun at the secondary (its disk write
// hung there) when incarnation 1 fences itself; incarnation 2 of the
// primary takes the retry and a newer write of the block. Whatever it
// answers, once the old forward lands both copies must hold the newer
// write (the peer's range lock holds the retry behind the old forward).
func TestReview99ForwardBegunAtPeerThenNextIncarnation(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.tick(3 * time.Second)
	base := b.e.reps[id].base
	h.holdWrite = func(x *hnode, w DiskWrite) bool { return x == b && w.Off >= base+MetaSize }
	q1 := h.write(a.id, id, 10, pattern(2, 1), nil)
	h.run()
	if len(h.held) != 1 {
		t.Fatalf("setup: %d held writes at b", len(h.held))
	}
	h.holdWrite = nil
	r99Fence(h, a)
	h.joined(id)
	_, ok1 := h.replies[q1]
	t.Logf("after a's restart: record %+v; attempt 1 answered %v %v", h.rec(id), ok1, h.replies[q1].Err)
	q2 := h.write(a.id, id, 10, pattern(2, 1), nil) // the retry
	h.run()
	q3 := h.write(a.id, id, 10, pattern(3, 1), nil) // a newer write
	h.run()
	h.tick(5 * time.Second)
	r2, ok2 := h.replies[q2]
	r3, ok3 := h.replies[q3]
	t.Logf("with incarnation 1's forward still unlanded at b: retry answered %v %v, newer write %v %v", ok2, r2.Err, ok3, r3.Err)
	for len(h.held) > 0 {
		h.release(0)
	}
	h.tick(10 * time.Second)
	r2, ok2 = h.replies[q2]
	r3, ok3 = h.replies[q3]
	t.Logf("once it landed: retry answered %v %v, newer write %v %v", ok2, r2.Err, ok3, r3.Err)
	if !ok3 || r3.Err != nil {
		t.Fatalf("the newer write not acknowledged after the old forward landed: %v %v", ok3, r3.Err)
	}
	{
		for _, n := range []*hnode{a, b} {
			if got := r99Block(h, n, id, 10); !bytes.Equal(got, pattern(3, 1)) {
				t.Fatalf("DEFECT: incarnation 2 acknowledged a newer write, then incarnation 1's forward landed over it on node %d (holds %q...)", n.id, got[:4])
			}
		}
	}
	t.Logf("final: record %+v", h.rec(id))
}

// The forward of incarnation 1 is still in the network (not delivered)
// when incarnation 2 serves; it is delivered to the secondary after
// incarnation 2 acknowledged the retry and a newer write. The secondary
// must refuse it (a past epoch).
func TestReview99ForwardInNetworkDeliveredAfterNextIncarnation(t *testing.T) {
	h, id, a, b := r71Pair(t)
	h.mustWrite(a.id, id, 10, pattern(1, 1))
	h.tick(3 * time.Second)
	var caught []Forward
	inc1 := a.inc
	h.mute = func(from, to NodeID, msg any) bool {
		if f, ok := msg.(Forward); ok && from == a.id && to == b.id && a.inc == inc1 {
			caught = append(caught, f)
			return true
		}
		return false
	}
	h.write(a.id, id, 10, pattern(2, 1), nil)
	h.run()
	if len(caught) == 0 {
		t.Fatal("setup: no forward caught")
	}
	r99Fence(h, a)
	h.mute = nil
	h.joined(id)
	h.tick(3 * time.Second)
	h.mustWrite(a.id, id, 10, pattern(2, 1))
	h.mustWrite(a.id, id, 10, pattern(3, 1))
	for _, f := range caught {
		h.exec(b, b.e.Deliver(h.env(b), a.id, f))
	}
	h.run()
	h.tick(3 * time.Second)
	for _, n := range []*hnode{a, b} {
		if got := r99Block(h, n, id, 10); !bytes.Equal(got, pattern(3, 1)) {
			t.Fatalf("DEFECT: incarnation 1's forward, delivered late, landed over incarnation 2's acknowledged write on node %d", n.id)
		}
	}
}

// The new field's wire form: field 5, a varint, named incarnation; an
// answer of an earlier build (no field 5) decodes as 0; a maybe answer
// keeps its incarnation through ResultOf, Marshal, Unmarshal, ResultError.
func TestReview99IncarnationWire(t *testing.T) {
	fd := (&pb.RLDevResult{}).ProtoReflect().Descriptor().Fields().ByNumber(5)
	if fd == nil || fd.Name() != "incarnation" || fd.Kind() != protoreflect.Uint64Kind {
		t.Fatalf("field 5: %v", fd)
	}
	for _, err := range []error{nil, errNone} {
		in := &pb.RLDevServiceWriteResponse{Result: ResultOf(err, 3, 1<<40+7)}
		b, merr := proto.Marshal(in)
		if merr != nil {
			t.Fatal(merr)
		}
		var out pb.RLDevServiceWriteResponse
		if err := proto.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		if out.Result.GetIncarnation() != 1<<40+7 || out.Result.GetEpoch() != 3 {
			t.Fatalf("round trip: %v", out.Result)
		}
	}
	old, _ := proto.Marshal(&pb.RLDevResult{Code: 1, MaybeWritten: true, Epoch: 4})
	var r pb.RLDevResult
	if err := proto.Unmarshal(old, &r); err != nil || r.Incarnation != 0 || !r.MaybeWritten {
		t.Fatalf("an earlier build's answer: %v %v", &r, err)
	}
}
