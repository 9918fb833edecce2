package rldev

import (
	"errors"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/lock"
)

// peerSamples are one of each peer message.
func peerSamples() []any {
	d := pattern(3, 2)
	return []any{
		Forward{RLDev: 1, Epoch: 2, Seq: 3, Block: 4, Gen: 5, Data: d, Fence: &Fence{Name: "map", Token: lock.Token{Epoch: 1, Seq: 9}}},
		Forward{RLDev: 1, Epoch: 2, Seq: 3, Block: 4, Gen: 5, Data: d},
		Ack{RLDev: 1, Seq: 3, Code: WrongEpoch, Epoch: 7},
		Pull{RLDev: 1, Epoch: 2, Seq: 3, Block: 4, Count: 2},
		Pull{RLDev: 1, Epoch: 2, Seq: 3, Block: 4, Count: 64, GensOnly: true},
		PullData{RLDev: 1, Seq: 3, Code: OK, Data: d, Gens: []uint64{5, 6}},
		PullData{RLDev: 1, Seq: 3, Code: Corrupt, Data: d, Gens: []uint64{5, 0}, Bad: []uint64{5}},
		PullData{RLDev: 1, Seq: 3, Code: OK, Gens: []uint64{5, 6}},
		PullData{RLDev: 1, Seq: 3, Code: NotServing},
		ResyncMe{RLDev: 1, Epoch: 2, Dirty: []uint64{0, 3}, Blank: true},
		Copy{RLDev: 1, Epoch: 2, Seq: 3, Block: 4, Data: d, Gens: []uint64{5, 6}},
		Copy{RLDev: 1, Epoch: 2, Seq: 3, Block: 4, Data: d, Gens: []uint64{5, 6}, Tokens: []Fence{{Name: "map", Token: lock.Token{Epoch: 3, Seq: 1}}}},
	}
}

func TestPeerWireRoundTrip(t *testing.T) {
	for _, m := range peerSamples() {
		b, err := proto.Marshal(EncodePeer(m))
		if err != nil {
			t.Fatal(err)
		}
		f := &pb.RLDevServicePeerRequest{}
		if err := proto.Unmarshal(b, f); err != nil {
			t.Fatal(err)
		}
		got, err := DecodePeer(f)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if !reflect.DeepEqual(normalize(got), normalize(m)) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, m)
		}
	}
	// Malformed frames are refused with ErrBadMessage.
	for _, f := range []*pb.RLDevServicePeerRequest{
		nil, {},
		{Msg: &pb.RLDevServicePeerRequest_Forward{Forward: &pb.RLDevForward{Data: []byte{1}}}},
		{Msg: &pb.RLDevServicePeerRequest_Pull{Pull: &pb.RLDevPull{Count: 0}}},
		{Msg: &pb.RLDevServicePeerRequest_Pull{Pull: &pb.RLDevPull{Count: MaxPullBlocks + 1}}},
		{Msg: &pb.RLDevServicePeerRequest_PullData{PullData: &pb.RLDevPullData{Data: make([]byte, BlockSize), Gens: []uint64{1, 2}}}},
		{Msg: &pb.RLDevServicePeerRequest_Copy{Copy: &pb.RLDevCopy{Data: make([]byte, BlockSize)}}},
		{Msg: &pb.RLDevServicePeerRequest_Ack{Ack: &pb.RLDevAck{Code: 99}}},
		{Msg: &pb.RLDevServicePeerRequest_Forward{Forward: &pb.RLDevForward{Data: make([]byte, BlockSize), Fence: &pb.RLDevFence{}}}},
		{Msg: &pb.RLDevServicePeerRequest_Hello{Hello: &pb.RLDevHello{Node: 1}}},
	} {
		if _, err := DecodePeer(f); !errors.Is(err, ErrBadMessage) {
			t.Fatalf("%v: %v, want ErrBadMessage", f, err)
		}
	}
}

// normalize makes empty slices nil (the wire does not tell them apart).
func normalize(m any) any {
	v := reflect.ValueOf(&m).Elem().Elem()
	c := reflect.New(v.Type()).Elem()
	c.Set(v)
	for i := 0; i < c.NumField(); i++ {
		if f := c.Field(i); f.Kind() == reflect.Slice && f.Len() == 0 {
			f.Set(reflect.Zero(f.Type()))
		}
	}
	return c.Interface()
}

func TestResultErrors(t *testing.T) {
	for _, err := range []error{nil, ErrNotPrimary, ErrCorrupt, errors.Join(ErrNotServing, ErrMaybeWritten)} {
		got := ResultError(ResultOf(err, 3))
		if (got == nil) != (err == nil) {
			t.Fatalf("%v → %v", err, got)
		}
		if err == nil {
			continue
		}
		if CodeOf(got) != CodeOf(err) || errors.Is(got, ErrMaybeWritten) != errors.Is(err, ErrMaybeWritten) {
			t.Fatalf("%v → %v", err, got)
		}
	}
}

// FuzzDecodePeer: any frame either decodes to a message that encodes back
// to the same message, or is refused with ErrBadMessage; never a panic.
func FuzzDecodePeer(f *testing.F) {
	for _, m := range peerSamples() {
		b, _ := proto.Marshal(EncodePeer(m))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr := &pb.RLDevServicePeerRequest{}
		if proto.Unmarshal(b, fr) != nil {
			return
		}
		m, err := DecodePeer(fr)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error without ErrBadMessage: %v", err)
			}
			return
		}
		again, err := DecodePeer(EncodePeer(m))
		if err != nil || !reflect.DeepEqual(normalize(again), normalize(m)) {
			t.Fatalf("re-encoding %#v: %#v, %v", m, again, err)
		}
	})
}

// FuzzDecodeOnDisk feeds the same bytes to every on-disk decoder: a data
// block, a metadata page and the payloads in it (superblock, a log's
// bitmap, the token table), a disk header. None may panic; what a page
// decoder accepts must carry a valid checksum.
func FuzzDecodeOnDisk(f *testing.F) {
	blk := make([]byte, PhysBlockSize)
	EncodeBlock(blk, 7, 3, 11, pattern(1, 1))
	f.Add(blk)
	for _, payload := range [][]byte{encodeSuper(Super{RLDev: 7, Blocks: 64, GenFloor: 99}), encodeBitmap(NewBitmap(8, 64))} {
		p, err := EncodePage(PageSuper, 4, payload, PageSize)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	tok, _ := encodeTokens(map[string]lock.Token{"map": {Epoch: 2, Seq: 5}})
	f.Add(tok)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= PhysBlockSize {
			DecodeBlock(b[:PhysBlockSize], 7, 3)
		}
		for _, kind := range []uint16{PageSuper, PageDRL, PageDegraded, PageTokens, PageDisk} {
			if _, payload, ok := DecodePage(b, kind); ok {
				decodeSuper(payload)
				decodeBitmap(payload, 8, 64)
				decodeTokens(payload)
			}
		}
		decodeSuper(b)
		decodeBitmap(b, 8, 64)
		decodeTokens(b)
		dev := disk.NewMemDevice(DiskReserved+MetaSize, nil)
		dev.WriteAt(b[:min(len(b), 2*PageSize)], 0)
		ReadDiskHeader(dev)
	})
}

// FuzzDecodeTable: a namespace with arbitrary records decodes or is
// refused; a table that decodes keeps every record's invariants.
func FuzzDecodeTable(f *testing.F) {
	r := &Record{ID: 1, Blocks: 64, Segs: [2]Segment{{Node: 1, Offset: DiskReserved}, {Node: 2, Offset: DiskReserved}}, Inc: [2]uint64{3, 4}}
	b, _ := proto.Marshal(r.PB())
	f.Add("rldev/0000000001", b)
	d, _ := proto.Marshal(&pb.RLDevDisk{Node: 1, Size: 1 << 30, Uuid: "ab"})
	f.Add("disk/1/0", d)
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		tb, err := DecodeTable(&pb.Namespace{Version: 1, Entries: []*pb.Entry{{Key: key, Value: value}}})
		if err != nil {
			return
		}
		for _, rec := range tb.RLDevs {
			if err := rec.Check(); err != nil {
				t.Fatalf("decoded a record that breaks an invariant: %v", err)
			}
		}
	})
}
