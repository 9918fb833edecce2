package rldev

import (
	"errors"
	"strings"
	"testing"
)

// A create whose turn of the chain falls on a full node goes to the next
// pair of neighbours with room (it failed though other nodes had room:
// found creating RLDevs by hand on a 4-node cluster), and fails, saying
// how much room each node has, only when no pair has it.
func TestCreatePassesOverAFullNode(t *testing.T) {
	const blocks = 1024
	seg := SegmentSize(blocks)
	tb := &Table{Version: 1, RLDevs: map[uint64]*Record{}, Disks: map[DiskKey]*Disk{}}
	for n := uint64(1); n <= 4; n++ {
		size := int64(DiskReserved) + 3*seg
		if n == 2 {
			size = int64(DiskReserved) + seg/2 // room for no segment
		}
		tb.Disks[DiskKey{n, 0}] = &Disk{Node: n, Index: 0, Size: size, Path: "d", UUID: "u"}
	}
	var pairs [][2]NodeID
	for {
		r, err := tb.Create(blocks, false)
		if err != nil {
			if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "node 2 ") {
				t.Fatalf("after %d RLDevs: %v (want ErrNoSpace naming each node's room)", len(pairs), err)
			}
			t.Logf("after %d RLDevs: %v", len(pairs), err)
			break
		}
		tb.RLDevs[r.ID] = r
		pairs = append(pairs, [2]NodeID{r.Segs[0].Node, r.Segs[1].Node})
		if len(pairs) > 20 {
			t.Fatal("no end to the room")
		}
	}
	t.Logf("pairs: %v", pairs)
	// 1-2 and 2-3 hold node 2, which has no room: the RLDevs go to 3-4
	// (or 4-1), neighbours of the chain, until node 4, in both, is full:
	// three.
	for i, p := range pairs {
		if p[0] == 2 || p[1] == 2 {
			t.Fatalf("RLDev %d on node 2, which has no room", i+1)
		}
		if p[1] != p[0]%4+1 {
			t.Fatalf("RLDev %d on %v: not neighbours of the chain", i+1, p)
		}
	}
	if len(pairs) < 3 {
		t.Fatalf("only %d RLDevs placed: %v (the chain's pairs 3-4 and 4-1 had room for more)", len(pairs), pairs)
	}
}
