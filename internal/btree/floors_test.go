package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func floorTok(client byte, seq uint64, attempt uint32, stamp int64, floor uint64) *WriteToken {
	tk := tok(client, seq, attempt, stamp)
	tk.Floor = floor
	return tk
}

// TestTokenFloors: a client that writes one key over and over, each write
// carrying its floor, has its records dropped in batches once they take
// half the leaf's room, none evicted (where without floors they piled up
// until evicted), another client's record stays, and a late duplicate of
// an answered write is refused below the floor. The teeth (records
// dropped, no floor kept): it applies again.
func TestTokenFloors(t *testing.T) {
	for _, teeth := range []bool{false, true} {
		ctx := context.Background()
		tr, _, clk := newTokTree(t, Config{})
		if teeth {
			tr.unsafeDone = unsafeDoneFloorForgets
		}
		applied := map[[2]uint64]int{}
		tr.onOutcome = func(tk WriteToken, key []byte, ok bool) {
			if ok {
				applied[[2]uint64{uint64(tk.Client[0]), tk.Seq}]++
			}
		}
		other := clk.now()
		if _, err := tr.PutOnce(ctx, []byte("hot"), []byte("other"), Cond{}, floorTok(2, 1, 1, other, 1)); err != nil {
			t.Fatal(err)
		}
		const n = 400
		stamps := make([]int64, n+1)
		for seq := uint64(1); seq <= n; seq++ {
			clk.ns.Add(1000)
			stamps[seq] = clk.now()
			if _, err := tr.PutOnce(ctx, []byte("hot"), []byte(fmt.Sprint(seq)), Cond{}, floorTok(1, seq, 1, stamps[seq], seq)); err != nil {
				t.Fatal(err)
			}
		}
		if teeth {
			// A late duplicate of write 5 finds neither its record nor
			// a floor.
			tr.PutOnce(ctx, []byte("hot"), []byte("5"), Cond{}, floorTok(1, 5, 2, stamps[5], 5))
			if applied[[2]uint64{1, 5}] < 2 {
				t.Fatal("teeth: a late duplicate below a forgotten floor was not applied again")
			}
			continue
		}
		if got := tr.Stats.RecordsFloored.Load(); got < n/2 {
			t.Fatalf("%d records dropped below the floor of %d writes", got, n)
		}
		if got := tr.Stats.RecordsEvicted.Load(); got != 0 {
			t.Fatalf("%d records evicted", got)
		}
		// A late duplicate of an answered write: refused, not applied.
		_, err := tr.PutOnce(ctx, []byte("hot"), []byte("5"), Cond{}, floorTok(1, 5, 2, stamps[5], 5))
		if !errors.Is(err, ErrTokenExpired) || applied[[2]uint64{1, 5}] != 1 || tr.Stats.RefusedFloor.Load() != 1 {
			t.Fatalf("a late duplicate below the floor: %v, applied %d times, %d refused below a floor", err, applied[[2]uint64{1, 5}], tr.Stats.RefusedFloor.Load())
		}
		// The last write's record and the other client's: kept.
		for _, tk := range []*WriteToken{floorTok(1, n, 2, stamps[n], n), floorTok(2, 1, 2, other, 1)} {
			r, err := tr.PutOnce(ctx, []byte("hot"), []byte(map[byte]string{1: fmt.Sprint(n), 2: "other"}[tk.Client[0]]), Cond{}, tk)
			if err != nil || !r.Repeat {
				t.Fatalf("client %d's write %d sent again: %+v %v", tk.Client[0], tk.Seq, r, err)
			}
		}
		// Past its life the floor goes (the duplicate is refused for age
		// then).
		clk.ns.Add(int64(TokenWindow + 2*ClockSkew + time.Second))
		dropped := tr.Stats.RecordsDropped.Load()
		if _, err := tr.Put(ctx, []byte("hot"), []byte("x"), Cond{}); err != nil {
			t.Fatal(err)
		}
		if _, err := tr.PutOnce(ctx, []byte("hot"), []byte("y"), Cond{}, floorTok(3, 1, 1, clk.now(), 1)); err != nil {
			t.Fatal(err)
		}
		if got := tr.Stats.RecordsDropped.Load() - dropped; got < 3 {
			t.Fatalf("past their life, %d records and floors dropped, want at least 3 (client 1's last records and floor, client 2's record)", got)
		}
	}
}

// TestTokenFloorsSplitMerge: a floor is a client's, not a key's: a split
// gives it to both halves, a merge keeps the higher, so a late duplicate
// of a write whose record a floor replaced is refused wherever its key
// goes.
func TestTokenFloorsSplitMerge(t *testing.T) {
	ctx := context.Background()
	tr, s, clk := newTokTree(t, Config{MaxFanout: 4})
	applied := map[uint64]int{}
	tr.onOutcome = func(tk WriteToken, key []byte, ok bool) {
		if ok && tk.Client[0] == 1 {
			applied[tk.Seq]++
		}
	}
	// Client 1 writes "y" (write 1), then "a" until its records take
	// half the one leaf's room: the leaf drops them, write 1's too, and
	// keeps a floor.
	s1 := clk.now()
	if _, err := tr.PutOnce(ctx, []byte("y"), []byte("1"), Cond{}, floorTok(1, 1, 1, s1, 1)); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(2); tr.Stats.RecordsFloored.Load() == 0; seq++ {
		if seq > 1000 {
			t.Fatal("no record dropped below a floor in 1000 writes")
		}
		clk.ns.Add(1000)
		if _, err := tr.PutOnce(ctx, []byte("a"), []byte("2"), Cond{}, floorTok(1, seq, 1, clk.now(), seq)); err != nil {
			t.Fatal(err)
		}
	}
	// Splits: "y" ends far to the right of "a".
	for c := 'b'; c <= 'x'; c++ {
		if _, err := tr.Put(ctx, []byte{byte(c)}, []byte("v"), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	if tr.Stats.Splits.Load() < 3 {
		t.Fatalf("%d splits", tr.Stats.Splits.Load())
	}
	dup := func(when string) {
		t.Helper()
		_, err := tr.PutOnce(ctx, []byte("y"), []byte("1"), Cond{}, floorTok(1, 1, 2, s1, 1))
		if !errors.Is(err, ErrTokenExpired) || applied[1] != 1 {
			t.Fatalf("%s: a late duplicate of write 1: %v, applied %d times", when, err, applied[1])
		}
	}
	dup("after the splits")
	// Merges: the keys between go, and compression runs.
	for c := 'b'; c <= 'x'; c++ {
		if _, err := tr.Delete(ctx, []byte{byte(c)}, Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	for pass := 0; pass < 10; pass++ {
		rep, err := tr.Repair(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Compressed == 0 {
			break
		}
	}
	if tr.Stats.Merges.Load() == 0 {
		t.Fatal("no merge")
	}
	dup("after the merges")
	sh, err := Walk(ctx, s, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(sh.Keys) != 2 {
		t.Fatalf("%d keys left", len(sh.Keys))
	}
}

// TestTrimFloors: floors age and are evicted as records are (oldest
// first, raising the horizon to the stamp of what goes).
func TestTrimFloors(t *testing.T) {
	n := &Node{Self: Handle{CM: 1, ID: 9}, Tree: 4, HighInf: true, Keys: [][]byte{[]byte("k")}, Vals: [][]byte{[]byte("v")}}
	n.Done = []Completion{{Key: []byte("k"), Client: [16]byte{1}, Seq: 9, Stamp: 300}}
	n.Floors = []Floor{{Client: [16]byte{2}, Seq: 4, Stamp: 100}, {Client: [16]byte{3}, Seq: 7, Stamp: 200}}
	// Room for the entries and two of the three: eviction goes down to
	// three quarters of the room, one.
	size := n.entriesSize() + doneOverhead + 2*(completionFixed+1)
	_, evicted := trimDone(n, size, 350, time.Second, 0)
	if evicted != 2 || len(n.Floors) != 0 || len(n.Done) != 1 || n.Horizon != 200 {
		t.Fatalf("evicted %d: floors %+v, records %d, horizon %d", evicted, n.Floors, len(n.Done), n.Horizon)
	}
	n.Floors = []Floor{{Client: [16]byte{2}, Seq: 4, Stamp: 100}}
	dropped, _ := trimDone(n, 1<<20, 100+int64(time.Second)+1, time.Second, 0)
	if dropped != 1 || n.Floors != nil || len(n.Done) != 1 {
		t.Fatalf("aged: dropped %d, floors %+v, records %d", dropped, n.Floors, len(n.Done))
	}
}

// TestFloorFormat: floors survive encoding, and the checks refuse floors
// that make no sense.
func TestFloorFormat(t *testing.T) {
	n := &Node{Self: Handle{CM: 1, ID: 9}, Tree: 4, HighInf: true, Version: 3,
		Keys: [][]byte{[]byte("a")}, Vals: [][]byte{[]byte("1")}}
	n.Floors = []Floor{{Client: [16]byte{2}, Seq: 4, Stamp: 100}}
	b := n.Encode(nil)
	if string(b[:4]) != "GBN2" || n.Size() != len(b) {
		t.Fatalf("a floor alone: %q, size %d of %d", b[:4], n.Size(), len(b))
	}
	got, err := Decode(b, 4, n.Self)
	if err != nil || len(got.Floors) != 1 || got.Floors[0] != n.Floors[0] || len(got.Done) != 0 {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	m := n.Clone()
	m.addDone(Completion{Key: []byte("a"), Client: [16]byte{7}, Seq: 2, Print: 9, Stamp: 11, Applied: true})
	m.Floors = append(m.Floors, Floor{Client: [16]byte{5}, Seq: 1, Stamp: 3})
	b2 := m.Encode(nil)
	got, err = Decode(b2, 4, m.Self)
	if err != nil || len(got.Floors) != 2 || len(got.Done) != 1 || got.Done[0].Seq != 2 {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	if d, ok := makeDelta(b, b2); ok {
		if out, err := applyDelta(b, d, true); err != nil || !bytes.Equal(out, b2) {
			t.Fatalf("a delta adding a record and a floor rebuilt %d bytes (%v)", len(out), err)
		}
	}
	for name, bad := range map[string]func(*Node){
		"two floors of one client": func(x *Node) { x.Floors[1].Client = x.Floors[0].Client },
		"a zero floor":             func(x *Node) { x.Floors[0].Seq = 0 },
		"a floor in a removed node": func(x *Node) {
			x.Deleted, x.Keys, x.Vals, x.Done = true, nil, nil, nil
		},
	} {
		x := m.Clone()
		bad(x)
		if err := x.Check(); err == nil {
			t.Fatalf("%s passed the check", name)
		}
	}
}

// TestServiceFloorChecks: a floor above its token's number is refused; a
// node whose cluster does not all read floors ignores them.
func TestServiceFloorChecks(t *testing.T) {
	on := true
	s := NewService(ServiceConfig{TokensOn: func() bool { return on }})
	bad := &pb.TreeWriteToken{Client: make([]byte, 16), Seq: 3, Attempt: 1, Stamp: 5, Floor: 4}
	if _, err := s.writeToken(bad); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a floor above its number: %v", err)
	}
	good := &pb.TreeWriteToken{Client: make([]byte, 16), Seq: 3, Attempt: 1, Stamp: 5, Floor: 3}
	if tk, err := s.writeToken(good); err != nil || tk.Floor != 3 {
		t.Fatalf("a floor at its number: %+v %v", tk, err)
	}
	if (&Service{}).floorsOn() {
		t.Fatal("floors on without a membership to check")
	}
}
