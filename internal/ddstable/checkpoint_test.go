package ddstable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
)

// The checkpoint transitions: a freeze, what it refuses, the checkpoint
// recorded; a restore of a dead group; the file's encoding.
func TestCheckpointTransitions(t *testing.T) {
	m := testMaps()
	p := m.DP.Leaves()[0]
	holder := m.RG[p][0]
	if _, err := WithFreeze(m, br(9)); err == nil {
		t.Fatal("a freeze held by a brick in no group")
	}
	f, err := WithFreeze(m, holder)
	if err != nil {
		t.Fatal(err)
	}
	if f.Freeze != (Freeze{ID: f.Epoch, Holder: holder}) || f.Epoch != m.Epoch+1 {
		t.Fatalf("freeze: %+v", f.Freeze)
	}
	if _, err := WithFreeze(f, holder); !errors.Is(err, ErrCheckpointing) {
		t.Fatalf("a second freeze: %v", err)
	}
	if _, err := WithSplitLease(f, p, holder); !errors.Is(err, ErrCheckpointing) {
		t.Fatalf("a split while frozen: %v", err)
	}
	short := f.Clone()
	short.RG[p] = short.RG[p][1:]
	if _, err := WithLease(short, p, br(7)); !errors.Is(err, ErrCheckpointing) {
		t.Fatalf("a recovery while frozen: %v", err)
	}
	if l, _ := WithSplitLease(m, p, holder); l != nil {
		if _, err := WithFreeze(l, holder); !errors.Is(err, ErrReshaping) {
			t.Fatalf("a freeze during a split: %v", err)
		}
	}
	for _, x := range []*Maps{f} {
		d, err := DecodeMaps(x.AppendBinary(nil))
		if err != nil || d.Stamp() != x.Stamp() || d.Freeze != x.Freeze {
			t.Fatalf("round trip: %v %+v", err, d)
		}
	}
	if c, changed := withoutDead(f, map[BrickID]bool{holder: true}); !changed || c.Freeze.ID != 0 || c.Validate() != nil {
		t.Fatalf("a dead holder's freeze: %+v %v", c.Freeze, c.Validate())
	}
	id := f.Freeze.ID
	if _, err := Checkpointed(f, id, holder); !errors.Is(err, ErrFreezeLost) {
		t.Fatalf("checkpointed before its members settled: %v", err)
	}
	w, err := FreezeSettled(f, id, holder)
	if err != nil || !w.Freeze.Write {
		t.Fatalf("settled: %v %+v", err, w.Freeze)
	}
	if d, err := DecodeMaps(w.AppendBinary(nil)); err != nil || d.Freeze != w.Freeze {
		t.Fatalf("round trip: %v", err)
	}
	if _, err := Checkpointed(w, id, br(9)); !errors.Is(err, ErrFreezeLost) {
		t.Fatalf("checkpointed by another: %v", err)
	}
	done, err := Checkpointed(w, id, holder)
	if err != nil || done.Freeze.ID != 0 || done.Checkpoint != (Checkpoint{ID: id, Epoch: done.Epoch}) {
		t.Fatalf("checkpointed: %v %+v", err, done)
	}
	if d, err := DecodeMaps(done.AppendBinary(nil)); err != nil || d.Checkpoint != done.Checkpoint {
		t.Fatalf("round trip: %v", err)
	}
	if again, _ := WithFreeze(done, holder); again.Freeze.ID <= id {
		t.Fatalf("the next checkpoint: %+v", again.Freeze)
	}
	c, ok := WithoutFreeze(f, holder)
	if !ok || c.Freeze.ID != 0 || c.Checkpoint.ID != 0 {
		t.Fatalf("given up: %+v", c)
	}
	if retry, _ := WithFreeze(c, holder); retry.Freeze.ID == id {
		t.Fatal("a checkpoint given up and asked again got the same id")
	}
	// A restore replaces a dead group by one brick, only as it was.
	dead := done.RG[p]
	if _, err := Restored(done, p, dead, id+1, br(7)); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("a restore from another checkpoint: %v", err)
	}
	if _, err := Restored(done, p, dead[1:], id, br(7)); !errors.Is(err, ErrLive) {
		t.Fatalf("a restore of a changed group: %v", err)
	}
	r, err := Restored(done, p, dead, id, BrickID{Node: 7, Inc: 2})
	if err != nil || len(r.RG[p]) != 1 || r.RG[p][0] != (BrickID{Node: 7, Inc: 2}) {
		t.Fatalf("restored: %v %+v", err, r.RG[p])
	}

	// The file.
	img := &CheckpointImage{Table: "users", Gen: 77, ID: 3, Partition: Partition{Bits: 1, Depth: 2},
		Entries: map[uint64][]byte{1: []byte("a"), 5: nil, 9: bytes.Repeat([]byte("x"), 1000)}}
	b := EncodeCheckpoint(img)
	d, err := DecodeCheckpoint(b)
	if err != nil || d.Table != img.Table || d.Gen != 77 || d.ID != 3 || d.Partition != img.Partition || len(d.Entries) != 3 || !bytes.Equal(d.Entries[9], img.Entries[9]) {
		t.Fatalf("round trip: %v %+v", err, d)
	}
	for i := range b {
		if _, err := DecodeCheckpoint(b[:i]); err == nil {
			t.Fatalf("a truncation to %d of %d bytes decoded", i, len(b))
		}
	}
	for _, i := range []int{0, 9, len(b) / 2, len(b) - 1} {
		c := bytes.Clone(b)
		c[i] ^= 0x10
		if _, err := DecodeCheckpoint(c); err == nil {
			t.Fatalf("a flipped bit at %d decoded", i)
		}
	}
	bad := *img
	bad.Entries = map[uint64][]byte{2: []byte("not in 01")}
	if _, err := DecodeCheckpoint(EncodeCheckpoint(&bad)); err == nil {
		t.Fatal("a key outside the partition decoded")
	}
}

func FuzzDecodeCheckpoint(f *testing.F) {
	f.Add(EncodeCheckpoint(&CheckpointImage{Table: "t", Gen: 1, ID: 1, Entries: map[uint64][]byte{1: []byte("a"), 2: nil}}))
	f.Add(EncodeCheckpoint(&CheckpointImage{Table: "users", Gen: 9, ID: 4, Partition: Partition{Bits: 2, Depth: 3}, Entries: map[uint64][]byte{2: []byte("b")}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= 4 && len(b)%2 == 1 {
			// Past the checksum half the time (review 124: the fuzzer
			// rarely got through it): the body as given, its CRC fixed.
			b = binary.LittleEndian.AppendUint32(b[:len(b)-4:len(b)-4], crc32.Checksum(b[:len(b)-4], castagnoli))
		}
		c, err := DecodeCheckpoint(b)
		if err != nil {
			return
		}
		// One image, one encoding.
		if again := EncodeCheckpoint(c); !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x as %x", b, again)
		}
	})
}
