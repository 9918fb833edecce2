package chunk

import (
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/lock"
)

// The map's decoders read what is on the map RLDev: a torn, stale or
// foreign block must be refused with an error, never panic, and what they
// accept must encode back to the same value.

func FuzzDecodeMap(f *testing.F) {
	l, err := NewLayout(4096)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(EncodeSuper(Super{CM: 1, Seq: 3, Slot: 1, CkBlocks: 1, CkBytes: 100, CkCRC: 7, LogGen: 2, LogFirst: 9, HighWater: 1024, Layout: l}))
	f.Add(EncodeCheckpoint(Checkpoint{CM: 1, Through: 8, HighWater: 2048,
		Chunks:      map[uint64]Extent{1: {RLDev: 2, Block: 1, Len: 8192}, 5: {RLDev: 3, Block: 9, Len: 1}},
		Quarantined: []Run{{RLDev: 2, Block: 40, Blocks: 3}}}))
	f.Add(EncodeFrame(Frame{Gen: 2, First: 9, Records: []Record{{Kind: RecReserve, HW: 2048},
		{Kind: RecAlloc, ID: 7, Extent: Extent{RLDev: 2, Block: 3, Len: 4096}}, {Kind: RecFree, ID: 5}}}))
	f.Add(EncodeCheckpoint(Checkpoint{CM: 1, Through: 8, HighWater: 4096, Chunks: map[uint64]Extent{1: {RLDev: 2, Block: 1, Len: 8192}},
		Reservations: []Resv{{ID: 100, Run: Run{RLDev: 2, Block: 50, Blocks: 20}, Count: 10, Size: 8192}}}))
	f.Add(EncodeFrame(Frame{Gen: 2, First: 9, Records: []Record{{Kind: RecResv, ID: 100, Resv: Resv{ID: 100, Run: Run{RLDev: 2, Block: 50, Blocks: 20}, Count: 10, Size: 8192}},
		{Kind: RecAlloc, ID: 101, Extent: Extent{RLDev: 2, Block: 50, Len: 8192}}, {Kind: RecResvClose, ID: 100}}}))
	f.Add(EncodeCheckpoint(Checkpoint{CM: 1, Through: 8, HighWater: 4096, Chunks: map[uint64]Extent{1: {RLDev: 2, Block: 1, Len: 8192}, 3: {RLDev: 2, Block: 5, Len: 4096}},
		Owned: map[uint64]Owner{3: {Log: 7, Token: lock.Token{Epoch: 2, Seq: 9}}}, Retired: map[uint64]lock.Token{7: {Epoch: 2, Seq: 5}}}))
	f.Add(EncodeFrame(Frame{Gen: 2, First: 9, Records: []Record{{Kind: RecAllocOwned, ID: 7, Extent: Extent{RLDev: 2, Block: 3, Len: 4096}, Owner: Owner{Log: 7, Token: lock.Token{Epoch: 2, Seq: 9}}},
		{Kind: RecDisown, ID: 7}, {Kind: RecRetire, Owner: Owner{Log: 7, Token: lock.Token{Epoch: 2, Seq: 10}}}}}))
	f.Add(make([]byte, BlockSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		if s, err := DecodeSuper(b); err == nil {
			if got, err := DecodeSuper(EncodeSuper(s)); err != nil || got != s {
				t.Fatalf("superblock %+v: round trip %+v, %v", s, got, err)
			}
		}
		if c, err := DecodeCheckpoint(b); err == nil {
			got, err := DecodeCheckpoint(EncodeCheckpoint(c))
			if err != nil || !reflect.DeepEqual(got, c) {
				t.Fatalf("checkpoint %+v: round trip %+v, %v", c, got, err)
			}
		}
		if fr, err := DecodeFrame(b); err == nil {
			if k := FrameLen(b); k < 1 || k > MaxFrameBlocks {
				t.Fatalf("a frame of %d blocks decoded", k)
			}
			got, err := DecodeFrame(EncodeFrame(fr))
			if err != nil || !reflect.DeepEqual(got, fr) {
				t.Fatalf("frame %+v: round trip %+v, %v", fr, got, err)
			}
		}
		_, _ = PickSuper(b, b)
	})
}

// Every record kind crosses the peer wire unchanged (the simulation passes
// Go values: this is the wire's own check).
func TestPeerUpdateRoundTrip(t *testing.T) {
	u := Update{CM: 3, First: 7, Records: []Record{
		{Kind: RecReserve, HW: 4096},
		{Kind: RecAlloc, ID: 9, Extent: Extent{RLDev: 2, Block: 5, Len: 8192}},
		{Kind: RecFree, ID: 4},
		{Kind: RecResv, ID: 10, Resv: Resv{ID: 10, Run: Run{RLDev: 2, Block: 40, Blocks: 6}, Count: 3, Size: 8000}},
		{Kind: RecAlloc, ID: 11, Extent: Extent{RLDev: 2, Block: 40, Len: 8000}},
		{Kind: RecResvClose, ID: 10},
		{Kind: RecAllocOwned, ID: 12, Extent: Extent{RLDev: 2, Block: 60, Len: 4096}, Owner: Owner{Log: 7, Token: lock.Token{Epoch: 3, Seq: 8}}},
		{Kind: RecDisown, ID: 12},
		{Kind: RecRetire, Owner: Owner{Log: 7, Token: lock.Token{Epoch: 3, Seq: 9}}},
	}}
	got, err := DecodePeer(EncodePeer(1, 2, u))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, u) {
		t.Fatalf("round trip:\n%+v\nwant\n%+v", got, u)
	}
	f := Frame{Gen: 1, First: 7, Records: u.Records}
	back, err := DecodeFrame(EncodeFrame(f))
	if err != nil || !reflect.DeepEqual(back, f) {
		t.Fatalf("frame round trip: %+v, %v", back, err)
	}
}

// The peer messages come off the network: a malformed one is refused
// with an error, never a panic, and what decodes encodes back the same.
func FuzzDecodePeer(f *testing.F) {
	for _, m := range []any{
		Update{CM: 1, Token: lock.Token{Epoch: 2, Seq: 3}, First: 7, Records: []Record{
			{Kind: RecReserve, HW: 4096},
			{Kind: RecAlloc, ID: 9, Extent: Extent{RLDev: 2, Block: 5, Len: 8192}},
			{Kind: RecAllocOwned, ID: 12, Extent: Extent{RLDev: 2, Block: 60, Len: 4096}, Owner: Owner{Log: 7, Token: lock.Token{Epoch: 3, Seq: 8}}},
			{Kind: RecDisown, ID: 12},
			{Kind: RecRetire, Owner: Owner{Log: 7, Token: lock.Token{Epoch: 3, Seq: 9}}},
			{Kind: RecResv, ID: 10, Resv: Resv{ID: 10, Run: Run{RLDev: 2, Block: 40, Blocks: 6}, Count: 3, Size: 8000}},
			{Kind: RecFree, ID: 4}, {Kind: RecResvClose, ID: 10}}},
		Ack{CM: 1, Code: AckGap, Inc: 3, LSN: 9, Token: lock.Token{Epoch: 1, Seq: 2}},
		Reload{CM: 1, Token: lock.Token{Epoch: 1, Seq: 2}},
	} {
		b, err := proto.Marshal(EncodePeer(1, 2, m))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r pb.ChunkServicePeerRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		m, err := DecodePeer(&r)
		if err != nil {
			return
		}
		back, err := DecodePeer(EncodePeer(r.FromNode, r.FromInc, m))
		if err != nil || !reflect.DeepEqual(back, m) {
			t.Fatalf("%+v: round trip %+v, %v", m, back, err)
		}
	})
}

// FuzzDecodeTable: the chunk namespace (one record per pair) is read from
// the config service by every node; any value under any key is decoded or
// refused, never a panic, and a pair that decodes passes its own check and
// stores back as the same record.
func FuzzDecodeTable(f *testing.F) {
	p := &Pair{ID: 3, Nodes: [2]uint64{1, 2}, Primary: 1, PrimaryInc: 4, Epoch: 5, Formatted: true, MapRLDev: 9, MapBlocks: 64,
		Data: []DataRLDev{{ID: 10, Blocks: 1024}}}
	if err := p.Check(); err != nil {
		f.Fatal(err)
	}
	op := p.PutOp()
	f.Add(op.Key, op.Value)
	f.Add("pair/0000000001", op.Value)
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		tb, err := DecodeTable(&pb.Namespace{Version: 2, Entries: []*pb.Entry{{Key: key, Value: b}}})
		if err != nil {
			return
		}
		for id, q := range tb.Pairs {
			if q.ID != id || q.Check() != nil {
				t.Fatalf("pair %d decoded as %+v", id, q)
			}
			again, err := DecodeTable(&pb.Namespace{Entries: []*pb.Entry{{Key: key, Value: mustMarshal(t, q.PB())}}})
			if err != nil || !reflect.DeepEqual(again.Pairs[id], q) {
				t.Fatalf("pair %+v stores back as %+v (%v)", q, again.Pairs[id], err)
			}
		}
	})
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
