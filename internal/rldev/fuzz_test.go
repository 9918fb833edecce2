package rldev

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
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
		got := ResultError(ResultOf(err, 3, 7))
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
// bitmap, the token table, the owed ranges), a disk header. None may panic; what a page
// decoder accepts must carry a valid checksum.
func FuzzDecodeOnDisk(f *testing.F) {
	blk := make([]byte, PhysBlockSize)
	EncodeBlock(blk, 7, 3, 11, pattern(1, 1))
	f.Add(blk)
	for _, payload := range [][]byte{encodeSuper(Super{RLDev: 7, Blocks: 64, GenFloor: 99}), encodeSuper(Super{RLDev: 7, Blocks: 64, Incomplete: true, Overwritten: true, TargetInc: 3}), encodeBitmap(NewBitmap(8, 64))} {
		p, err := EncodePage(PageSuper, 4, payload, PageSize)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	tok, _ := encodeTokens(map[string]lock.Token{"map": {Epoch: 2, Seq: 5}})
	f.Add(tok)
	ob := NewBitmap(8, 64)
	ob.Set(2)
	f.Add(encodeOwed(ob, []run{{first: 3, n: 2}, {first: 60, n: 4}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= PhysBlockSize {
			DecodeBlock(b[:PhysBlockSize], 7, 3)
		}
		for _, kind := range []uint16{PageSuper, PageDRL, PageDegraded, PageTokens, PageDisk, PageOwed} {
			if _, payload, ok := DecodePage(b, kind); ok {
				decodeSuper(payload)
				decodeBitmap(payload, 8, 64)
				decodeTokens(payload)
				decodeOwed(payload, 8, 64)
			}
		}
		// An owed page that decodes names whole regions and ranges inside
		// the segment only, and encodes back to itself.
		if bits, runs, err := decodeOwed(b, 8, 64); err == nil {
			for _, x := range bits.List() {
				if x*8 >= 64 {
					t.Fatalf("owed page %x names region %d past the segment", b, x)
				}
			}
			for _, g := range runs {
				if g.n == 0 || g.first+g.n > 64 {
					t.Fatalf("owed page %x names range %+v outside the segment", b, g)
				}
			}
			if !bytes.Equal(encodeOwed(bits, runs), b) {
				t.Fatalf("owed page %x decodes to %v %v, which encodes otherwise", b, bits, runs)
			}
		}
		if sb, err := decodeSuper(b); err == nil && !bytes.Equal(encodeSuper(sb), b) {
			t.Fatalf("superblock %x decodes to %+v, which encodes to %x", b, sb, encodeSuper(sb))
		}
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
	// Two extents retiring, one a move's target given up (review 83).
	rt := r.Clone()
	old, tgt := Segment{Node: 3, Offset: DiskReserved}, Segment{Node: 4, Disk: 1, Offset: DiskReserved + PageSize}
	rt.retire(old, false)
	rt.retire(tgt, true)
	b, _ = proto.Marshal(rt.PB())
	f.Add("rldev/0000000001", b)
	d, _ := proto.Marshal(&pb.RLDevDisk{Node: 1, Size: 1 << 30, Uuid: "ab"})
	f.Add("disk/1/0", d)
	d, _ = proto.Marshal(&pb.RLDevDisk{Node: 3, Index: 1, Size: 1 << 30, Uuid: "cd", Forgotten: true}) // forget.go
	f.Add("disk/3/1", d)
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		tb, err := DecodeTable(&pb.Namespace{Version: 1, Entries: []*pb.Entry{{Key: key, Value: value}}})
		if err != nil {
			return
		}
		for _, rec := range tb.RLDevs {
			if err := rec.Check(); err != nil {
				t.Fatalf("decoded a record that breaks an invariant: %v", err)
			}
			// What decodes encodes to the same record.
			again, err := DecodeTable(&pb.Namespace{Version: 1, Entries: []*pb.Entry{{Key: recordKey(rec.ID), Value: marshalOrFail(t, rec.PB())}}})
			if err != nil || !reflect.DeepEqual(again.RLDevs[rec.ID], rec) {
				t.Fatalf("record does not round-trip: %+v\nagain %+v (%v)", rec, again.RLDevs[rec.ID], err)
			}
		}
	})
}

// Frames of the data path round-trip: header, meta and bulk.
func TestDataFrameRoundTrip(t *testing.T) {
	// dataConn.Write copies a write request's fields but its data by
	// name: a new field must be added there.
	if n := (&pb.RLDevServiceWriteRequest{}).ProtoReflect().Descriptor().Fields().Len(); n != 8 {
		t.Fatalf("RLDevServiceWriteRequest has %d fields: copy the new ones in dataConn.Write", n)
	}
	var stream []byte
	d := pattern(7, 2)
	w := &pb.RLDevServiceWriteRequest{Rldev: 3, Offset: 8192, Fence: fenceToPB(&Fence{Name: "m", Token: lock.Token{Epoch: 1, Seq: 2}})}
	h, err := encodeFrame(frameWrite, 42, w, len(d))
	if err != nil {
		t.Fatal(err)
	}
	stream = append(append(stream, h...), d...)
	pm := EncodePeer(peerSamples()[0])
	pd := splitBulk(pm)
	h, err = encodeFrame(framePeer, 0, pm, len(pd))
	if err != nil {
		t.Fatal(err)
	}
	stream = append(append(stream, h...), pd...)
	br := bufio.NewReader(bytes.NewReader(stream))
	f, err := readFrame(br, nil, 0)
	if err != nil || f.typ != frameWrite || f.id != 42 || !bytes.Equal(f.bulk, d) {
		t.Fatalf("write frame: %+v %v", f, err)
	}
	start, id, _, _, err := clientRequest(f)
	if err != nil || start == nil || id != 3 {
		t.Fatalf("write request: id %d, %v", id, err)
	}
	f, err = readFrame(br, nil, 0)
	if err != nil || f.typ != framePeer {
		t.Fatalf("peer frame: %+v %v", f, err)
	}
	m := &pb.RLDevServicePeerRequest{}
	if err := proto.Unmarshal(f.meta, m); err != nil {
		t.Fatal(err)
	}
	if err := joinBulk(m, f.bulk); err != nil {
		t.Fatal(err)
	}
	if got, err := DecodePeer(m); err != nil || !reflect.DeepEqual(got, peerSamples()[0]) {
		t.Fatalf("peer message: %+v %v", got, err)
	}
	if _, err := readFrame(br, nil, 0); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v", err)
	}
	// A bad request is answered, not dropped: unaligned.
	h, _ = encodeFrame(frameRead, 1, &pb.RLDevServiceReadRequest{Rldev: 1, Offset: 5, Length: 4096}, 0)
	f, _ = readFrame(bufio.NewReader(bytes.NewReader(h)), nil, 0)
	if _, _, _, respond, err := clientRequest(f); !errors.Is(err, ErrBadRequest) || respond == nil {
		t.Fatalf("an unaligned read: %v", err)
	}
	// Too large a frame is refused when encoded and when read.
	if _, err := encodeFrame(frameWrite, 1, w, maxFrame); err == nil {
		t.Fatal("an oversized frame encoded")
	}
	big := binary.BigEndian.AppendUint32(nil, maxFrame+1)
	big = append(big, make([]byte, frameHeader)...)
	if _, err := readFrame(bufio.NewReader(bytes.NewReader(big)), nil, 0); !errors.Is(err, errFrame) {
		t.Fatalf("an oversized frame read: %v", err)
	}
}

// FuzzDataFrames: any byte stream on a data-path connection decodes into
// frames and requests, or fails cleanly.
func FuzzDataFrames(f *testing.F) {
	h, _ := encodeFrame(frameWrite, 42, &pb.RLDevServiceWriteRequest{Rldev: 3, Offset: 8192}, 4096)
	f.Add(append(h, make([]byte, 4096)...))
	h, _ = encodeFrame(frameRead, 7, &pb.RLDevServiceReadRequest{Rldev: 3, Offset: 0, Length: 8192, Replica: 1}, 0)
	f.Add(h)
	pm := EncodePeer(peerSamples()[5])
	pd := splitBulk(pm)
	h, _ = encodeFrame(framePeer, 0, pm, len(pd))
	f.Add(append(h, pd...))
	h, _ = encodeFrame(frameHello, 0, &pb.RLDevHello{Node: 1, Incarnation: 2, ToNode: 3}, 0)
	f.Add(h)
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReader(bytes.NewReader(b))
		for i := 0; i < 16; i++ {
			frameReady(br)
			fr, err := readFrame(br, nil, 0)
			if err != nil {
				return
			}
			switch fr.typ {
			case frameRead, frameWrite:
				start, _, _, respond, err := clientRequest(fr)
				if err == nil && start == nil || respond == nil {
					t.Fatalf("request %d: no start without an error", fr.typ)
				}
				if err == nil {
					if _, _, err := respond(Reply{}, 1, 2); err != nil {
						t.Fatalf("the reply to a request does not encode: %v", err)
					}
				}
			case framePeer:
				m := &pb.RLDevServicePeerRequest{}
				if proto.Unmarshal(fr.meta, m) == nil && joinBulk(m, fr.bulk) == nil {
					DecodePeer(m)
				}
			}
		}
	})
}

// Every peer message crosses the data path with its blocks as bulk.
func TestPeerFramesRoundTrip(t *testing.T) {
	for _, want := range peerSamples() {
		pm := EncodePeer(want)
		pd := splitBulk(pm)
		h, err := encodeFrame(framePeer, 0, pm, len(pd))
		if err != nil {
			t.Fatal(err)
		}
		f, err := readFrame(bufio.NewReader(bytes.NewReader(append(h, pd...))), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		m := &pb.RLDevServicePeerRequest{}
		if err := proto.Unmarshal(f.meta, m); err != nil {
			t.Fatal(err)
		}
		if err := joinBulk(m, f.bulk); err != nil {
			t.Fatal(err)
		}
		if got, err := DecodePeer(m); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%T: got %+v (%v)", want, got, err)
		}
	}
	// Bulk on a message without blocks is refused.
	if err := joinBulk(EncodePeer(Ack{RLDev: 1}), []byte{1}); !errors.Is(err, errFrame) {
		t.Fatalf("bulk on an ack: %v", err)
	}
}

func marshalOrFail(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
