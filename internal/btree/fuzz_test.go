package btree

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func sampleImages() [][]byte {
	leaf := &Node{Self: Handle{CM: 1, ID: 7}, Tree: 3, LSN: 9, Low: []byte("b"), High: []byte("m"), Right: Handle{CM: 1, ID: 8},
		Keys: [][]byte{[]byte("b"), []byte("c")}, Vals: [][]byte{[]byte("1"), {}},
		Garbage: []Garbage{{Node: Handle{CM: 2, ID: 5}, Deadline: 77}}}
	inner := &Node{Self: Handle{CM: 1, ID: 9}, Tree: 3, Level: 2, HighInf: true,
		Keys: [][]byte{nil, []byte("k")}, Kids: []Handle{{CM: 1, ID: 7}, {CM: 1, ID: 8}}}
	gone := &Node{Self: Handle{CM: 1, ID: 8}, Tree: 3, Deleted: true, Onward: Handle{CM: 1, ID: 7}, Low: []byte("m"), HighInf: true}
	a := &Anchor{Self: Handle{CM: 1, ID: 3}, Leftmost: []Handle{{CM: 1, ID: 7}, {CM: 1, ID: 9}}}
	_, ref := EncodeValue(3, Handle{CM: 2, ID: 11}, []byte("a value in a chunk of its own"))
	ext := &Node{Self: Handle{CM: 1, ID: 10}, Tree: 3, HighInf: true,
		Keys: [][]byte{[]byte("a"), []byte("b"), []byte("c")}, Vals: [][]byte{[]byte("1"), ref.Encode(), {}}, Ext: []bool{false, true, false}}
	// Format version 2: completion records (one of an absent key: a
	// delete's or a failed condition's) and a horizon.
	done := leaf.Clone()
	done.Horizon = 41
	done.Done = []Completion{
		{Key: []byte("b"), Client: [16]byte{1, 2, 3}, Seq: 7, Print: 0xfeed, Stamp: 55, Applied: true},
		{Key: []byte("bb"), Client: [16]byte{9}, Seq: 1, Print: 3, Stamp: 60, Found: true},
		{Key: []byte("c"), Client: [16]byte{1, 2, 3}, Seq: 8, Print: 4, Stamp: 61, Applied: true, Found: true}}
	// Floors (after the records), with and without records.
	floors := done.Clone()
	floors.Floors = []Floor{{Client: [16]byte{1, 2, 3}, Seq: 7, Stamp: 50}, {Client: [16]byte{4}, Seq: 2, Stamp: 12}}
	onlyFloor := leaf.Clone()
	onlyFloor.Floors = []Floor{{Client: [16]byte{5}, Seq: 9, Stamp: 70}}
	return [][]byte{leaf.Encode(nil), inner.Encode(nil), gone.Encode(nil), ext.Encode(nil), done.Encode(nil), floors.Encode(nil), onlyFloor.Encode(nil), a.Encode(nil)}
}

// FuzzDecodeValue: any bytes either decode, as a value chunk, to the value
// that encodes back to them, or are refused; never a panic. A reference
// decodes only from refSize bytes naming a real chunk.
func FuzzDecodeValue(f *testing.F) {
	img, ref := EncodeValue(3, Handle{CM: 2, ID: 11}, []byte("value"))
	f.Add(img, ref.Encode())
	f.Add(append(img, 1, 2), ref.Encode())
	f.Add(img[:20], []byte{1})
	f.Fuzz(func(t *testing.T, b, rb []byte) {
		r, err := DecodeRef(rb)
		if err != nil {
			return
		}
		if !bytes.Equal(r.Encode(), rb) {
			t.Fatal("reference re-encoding differs")
		}
		v, err := DecodeValue(b, 3, r)
		if err != nil {
			return
		}
		again, r2 := EncodeValue(3, r.Chunk, v)
		if r2 != r || !bytes.Equal(again, b[:len(again)]) {
			t.Fatalf("value re-encoding differs: ref %+v, decoded from %+v", r2, r)
		}
	})
}

func TestValueRoundTrip(t *testing.T) {
	self := Handle{CM: 2, ID: 11}
	img, ref := EncodeValue(3, self, []byte("some value"))
	if v, err := DecodeValue(img, 3, ref); err != nil || string(v) != "some value" {
		t.Fatalf("round trip: %q %v", v, err)
	}
	for i := 0; i < len(img); i++ { // every flipped bit is caught
		if i >= 8 && i < 12 {
			continue // the CRC word itself: a flip there is a mismatch too, checked below
		}
		c := bytes.Clone(img)
		c[i] ^= 0x10
		if _, err := DecodeValue(c, 3, ref); err == nil {
			t.Fatalf("a flip at byte %d decoded", i)
		}
	}
	c := bytes.Clone(img)
	c[9] ^= 1
	if _, err := DecodeValue(c, 3, ref); err == nil {
		t.Fatal("a flipped checksum decoded")
	}
	if _, err := DecodeValue(img[:len(img)-1], 3, ref); err == nil {
		t.Fatal("a torn value decoded")
	}
	if _, err := DecodeValue(img, 4, ref); err == nil {
		t.Fatal("another tree's value decoded")
	}
	other := ref
	other.Chunk = Handle{CM: 2, ID: 12}
	if _, err := DecodeValue(img, 3, other); err == nil {
		t.Fatal("a misdirected value decoded")
	}
	_, ref2 := EncodeValue(3, self, []byte("other value"))
	if _, err := DecodeValue(img, 3, ref2); err == nil {
		t.Fatal("a value other than the reference's decoded (a reused chunk)")
	}
}

// FuzzDecodeNode: any bytes either decode to an image that encodes back to
// the same bytes, or are refused with an error; never a panic.
func FuzzDecodeNode(f *testing.F) {
	for _, b := range sampleImages() {
		f.Add(b)
		f.Add(append(b, 0, 0, 0))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := decode(b); err == nil {
			if err := n.Check(); err != nil {
				t.Fatalf("decoded an image that fails its check: %v", err)
			}
			length := len(n.Encode(nil))
			if !bytes.Equal(n.Encode(nil), b[:length]) || n.Size() != length {
				t.Fatalf("re-encoding differs (size %d, encoded %d)", n.Size(), length)
			}
		}
		if len(b) >= 24 {
			if a, err := DecodeAnchor(b, getHandle(b[12:])); err == nil {
				if !bytes.Equal(a.Encode(nil), b[:len(a.Encode(nil))]) {
					t.Fatal("anchor re-encoding differs")
				}
			}
		}
	})
}

func TestNodeRoundTrip(t *testing.T) {
	imgs := sampleImages()
	for _, b := range imgs[:len(imgs)-1] { // (the last is an anchor)
		n, err := decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if n.Size() != len(b) {
			t.Fatalf("size %d, image %d bytes", n.Size(), len(b))
		}
		for i := 12; i < len(b); i++ { // every flipped bit is caught
			c := bytes.Clone(b)
			c[i] ^= 0x10
			if _, err := decode(c); err == nil {
				t.Fatalf("a flip at byte %d decoded", i)
			}
		}
		if _, err := decode(b[:len(b)-1]); err == nil {
			t.Fatal("a torn image decoded")
		}
		if _, err := Decode(b, n.Tree, Handle{CM: 5, ID: 5}); err == nil {
			t.Fatal("a misdirected image decoded")
		}
	}
}

// An image of another format version is refused as such, not as torn.
func TestDecodeOtherFormatVersion(t *testing.T) {
	n := &Node{Tree: 7, Self: Handle{CM: 1, ID: 9}, HighInf: true}
	b := n.Encode(nil)
	if _, err := Decode(b, 7, n.Self); err != nil {
		t.Fatal(err)
	}
	b[3] = '3'
	if _, err := Decode(b, 7, n.Self); !errors.Is(err, ErrFormatVersion) || !strings.Contains(err.Error(), "format version 3; this build reads versions 1 and 2") {
		t.Fatalf("node of version 3: %v", err)
	}
	img, ref := EncodeValue(7, Handle{CM: 1, ID: 10}, []byte("value"))
	img[3] = '3'
	if _, err := DecodeValue(img, 7, ref); !errors.Is(err, ErrFormatVersion) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("value of version 3: %v", err)
	}
	b[0] = 'X' // not ours at all: corrupt, not a version
	if _, err := Decode(b, 7, n.Self); errors.Is(err, ErrFormatVersion) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("no magic: %v", err)
	}
}
